"""How a stopping worker ends the runs still going: a grace period to finish, then a
cancel, then a bounded wait for the cancel to land.

A handler can ignore a cancel (it catches CancelledError and goes on, or blocks in a
thread it awaits). Waiting for it without end left the worker stuck in stop() with its
heartbeat still beating, so that run's job stayed `running` under a live lease for as
long as the process lived, and SIGTERM never ended the process. Past the wait the worker
stops without it: the job stays `running` (it may be doing its work still, so it is not
handed back for a second worker to run at once), the heartbeat stops, and the rescuer
takes the job back after the lease, the attempt counted, as after a crash.

And how it ends its claim loop: a claim in flight finishes first, so that the jobs it
brings in are handed back with the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

from postrelay.core.telemetry import event

CANCEL_WAIT_SECS = 5.0  # for the cancelled runs to end: a handler's cleanup, its awaits
CLAIM_WAIT_SECS = 10.0  # for a claim in flight, as long as a connect may take


async def end_runs(
    tasks: Collection[asyncio.Task[None]], grace_secs: float,
    cancel_wait_secs: float = CANCEL_WAIT_SECS,
) -> set[asyncio.Task[None]]:
    """Let `tasks` finish within `grace_secs`, cancel the rest and wait up to
    `cancel_wait_secs` for them; returns those still running, whose handlers ignored the
    cancel."""
    if not tasks:
        return set()
    _, going = await asyncio.wait(tasks, timeout=grace_secs)
    for task in going:
        task.cancel()  # the executor turns this into a Returned outcome
    if going:
        _, going = await asyncio.wait(going, timeout=cancel_wait_secs)
    if going:
        event("postrelay.worker.runs_abandoned", logging.ERROR, count=len(going),
              waited_secs=cancel_wait_secs,
              reason="their handlers ignored the cancel; the rescuer takes their jobs back "
                     "after the lease")
    return going


async def end_claim(task: asyncio.Task[None] | None, wait_secs: float = CLAIM_WAIT_SECS) -> None:
    """Let a claim loop already told to stop end by itself: a claim in flight finishes,
    and the worker hands back what it brought in. Cancelled instead, a claim whose commit
    the server had made left its jobs `running` under a worker about to be gone, for the
    rescuer after the lease, their attempt counted. A claim still waiting after `wait_secs`
    (a database that does not answer) is cancelled."""
    if task is None:
        return
    _, waiting = await asyncio.wait({task}, timeout=wait_secs)
    if waiting:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
