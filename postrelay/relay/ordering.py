"""Strict order per aggregate, for routes that ask for it (`JobRequest(ordered=True)`).

The queue runs jobs in parallel; order is kept here, by the relay, which creates an
aggregate's next ordered job only once the previous one has finished. An event whose
aggregate is busy stays in the outbox a little longer (deferred, no attempt counted), and
different aggregates keep running in parallel. The queue's hot path pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import psycopg

from postrelay.core.dbcall import driver_fetch
from postrelay.relay.queries import OUTBOX_SQL
from postrelay.relay.routing import Event

DEFER_SECS = 0.05


class OrderedPlan(Protocol):
    @property
    def event(self) -> Event: ...

    @property
    def ordered(self) -> bool: ...


P = TypeVar("P", bound=OrderedPlan)


def aggregate_of(event: Event) -> tuple[Any, str, str]:
    return (event.tenant_id, event.aggregate_type, event.aggregate_id)


async def hold_back(
    conn: psycopg.AsyncConnection[Any], plans: Sequence[P]
) -> tuple[list[P], list[P]]:
    """Split `plans` (in claim order, oldest first) into those that may go now and those
    that must wait for an earlier event of their aggregate."""
    ordered = [p for p in plans if p.ordered]
    if not ordered:
        return list(plans), []
    rows = await driver_fetch(conn, OUTBOX_SQL["outbox_blocked_aggregates"], {
        "event_ids": [p.event.id for p in ordered],
        "tenant_ids": [p.event.tenant_id for p in ordered],
        "aggregate_types": [p.event.aggregate_type for p in ordered],
        "aggregate_ids": [p.event.aggregate_id for p in ordered],
        "seqs": [p.event.seq for p in ordered],
    })
    busy = {tuple(row) for row in rows}
    go, wait = [], []
    for plan in plans:
        if not plan.ordered:
            go.append(plan)
            continue
        key = aggregate_of(plan.event)
        if key in busy:
            wait.append(plan)
        else:
            go.append(plan)
            busy.add(key)  # later events of this aggregate in the batch wait their turn
    return go, wait


async def defer(conn: psycopg.AsyncConnection[Any], plans: Sequence[OrderedPlan]) -> None:
    if plans:
        await driver_fetch(conn, OUTBOX_SQL["outbox_defer_many"],
                           {"ids": [p.event.id for p in plans], "delay": DEFER_SECS})
