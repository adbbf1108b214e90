"""The README's Python examples, read from the README and run as written against the real
PostgreSQL, so that an example that no longer runs fails here rather than for a reader.
Names an example takes as given (`engine`, `tenant_id`, an `orders` table, a `search`
service) are supplied; the default registries they register into are fresh ones."""

from __future__ import annotations

import re
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, text

import postrelay.orchestrator.routes as email_routes
import postrelay.queue.registry as job_registry
import postrelay.relay.routing as routing
from postrelay.queue import Registry
from postrelay.queue.model import Job
from postrelay.relay import Event, JobRequest, RouteRegistry
from tests.factories import job_row

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def example(first_line: str) -> str:
    found = [block for block in BLOCKS if block.lstrip().startswith(first_line)]
    assert len(found) == 1, f"no single README example begins {first_line!r}"
    return found[0]


async def run_example(source: str, names: dict[str, Any]) -> dict[str, Any]:
    """Run `source` as the body of a coroutine (the examples use `async with` at the top
    level); returns the names it left."""
    body = textwrap.indent(source + "\nreturn locals()", "    ")
    namespace = dict(names)
    exec(compile(f"async def _example():\n{body}", "README.md", "exec"), namespace)
    return dict(await namespace["_example"]())


@pytest.fixture
def orders(engine):
    table = Table("orders", MetaData(), Column("id", Integer, primary_key=True))
    table.create(engine)
    yield table
    table.drop(engine)


@pytest.fixture
def fresh_registries(monkeypatch):
    jobs, routes = Registry(), RouteRegistry()
    monkeypatch.setattr(job_registry, "default_registry", jobs)
    monkeypatch.setattr(routing, "default_routes", routes)
    monkeypatch.setattr(email_routes, "default_routes", routes)
    return jobs, routes


async def test_the_enqueue_example_runs(engine, async_engine, tenant, orders):
    left = await run_example(example("import postrelay.queue as pq"), {
        "engine": engine, "async_engine": async_engine, "tenant_id": tenant,
        "orders": orders})
    with engine.connect() as conn:
        job = job_row(conn, left["job_id"])
        assert (job["priority"], job["idempotency_key"]) == (10, "order-42")
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job WHERE tenant_id = :t"),
                            {"t": tenant}).scalar_one() == 5002
    assert len(left["ids"]) == 5000


async def test_the_handler_example_runs(fresh_registries):
    jobs, _ = fresh_registries
    reindexed: list[int] = []

    class Search:
        async def reindex(self, order: int) -> None:
            reindexed.append(order)

    await run_example(example("# myapp/jobs.py"), {"search": Search()})
    handler = jobs.get("reindex")
    assert handler is not None and handler.timeout_secs == 60
    now = datetime.now(UTC)
    await handler.fn(Job(id=uuid4(), tenant_id=uuid4(), kind="reindex", payload={"order": 42},
                         priority=100, attempts=1, max_attempts=8, available_at=now,
                         claimed_at=now, created_at=now, idempotency_key=None))
    assert reindexed == [42]


async def test_the_outbox_example_runs(engine, async_engine, tenant, orders, fresh_registries):
    _, routes = fresh_registries
    await run_example(example("from postrelay.relay import emit"), {
        "engine": engine, "async_engine": async_engine, "tenant_id": tenant,
        "orders": orders})
    with engine.connect() as conn:
        assert conn.execute(text(
            "SELECT count(*) FROM mdm.aa_outbox_event WHERE tenant_id = :t"), {"t": tenant}
        ).scalar_one() == 2
    now = datetime.now(UTC)
    placed = Event(id=uuid4(), tenant_id=tenant, aggregate_type="order", aggregate_id="42",
                   event_type="order.placed", payload={"total": 99}, headers={},
                   created_at=now, attempts=0, seq=1)
    assert [r.requests(placed) for r in routes.matching("order.placed")] == [
        [JobRequest("reindex", {"order": "42"})]]
    opened = Event(id=uuid4(), tenant_id=tenant, aggregate_type="account", aggregate_id="7",
                   event_type="account.opened", payload={"n": 1}, headers={},
                   created_at=now, attempts=0, seq=2)
    assert [r.requests(opened) for r in routes.matching("account.opened")] == [
        [JobRequest("bulk_import", {"n": 1}, ordered=True)]]


async def test_the_email_route_example_runs(fresh_registries):
    _, routes = fresh_registries
    await run_example(example("# myapp/routes.py"), {"ACME_ID": uuid4()})
    for event_type in ("user.signed_up", "invoice.issued", "post.published"):
        assert len(routes.matching(event_type)) == 1, event_type
