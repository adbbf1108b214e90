"""Routes that fail in odd ways: each failure stays with its own event, visible as its
last_error, and the events beside it are relayed in the same batch."""

from __future__ import annotations

import sys

import pytest
from sqlalchemy import text

from postrelay.relay import Event, JobRequest, Relay, RouteRegistry, emit


@pytest.fixture
def outbox_clean(clean_db):
    """clean_db empties the outbox tables too."""


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no words for it")


def odd_routes() -> RouteRegistry:
    routes = RouteRegistry()

    @routes.route("order.placed", name="odd")
    def odd(event: Event) -> JobRequest:
        match event.payload["n"]:
            case 1:
                raise ValueError("a NUL \x00 in the message")
            case 2:
                raise ValueError("a byte that was not UTF-8: \udcff")
            case 3:
                raise Unprintable()
            case 4:
                return JobRequest("reindex", {}, ordered=None)  # type: ignore[arg-type]
        return JobRequest("reindex", {"n": event.payload["n"]})

    return routes


async def test_a_route_failing_oddly_fails_only_its_event(engine, async_engine, tenant,
                                                          outbox_clean):
    """An error the database cannot store (a NUL, a lone surrogate), one whose str()
    raises, or a request whose `ordered` is not a bool failed the whole batch, again at
    every retry: the relay stalled on every event behind it."""
    with engine.begin() as conn:
        ids = [emit(conn, "order.placed", {"n": n}, tenant_id=tenant, aggregate_type="order",
                    aggregate_id=n) for n in range(6)]
    result = await Relay(async_engine, odd_routes()).run_once()
    assert (result.handled, result.jobs, result.failed) == (2, 2, 4)
    with engine.connect() as conn:
        errors = dict(conn.execute(text(
            "SELECT id, last_error FROM mdm.aa_outbox_event WHERE handled_at IS NULL")).all())
    assert set(errors) == set(ids[1:5])
    assert errors[ids[1]] == "ValueError: a NUL \ufffd in the message"
    assert errors[ids[2]] == "ValueError: a byte that was not UTF-8: \ufffd"
    assert errors[ids[3]] == "Unprintable: <exception str() failed>"
    assert "ordered: must be True or False" in errors[ids[4]]


class OwnBaseException(BaseException):
    """A library's BaseException of its own, as some use for control flow."""


async def test_a_route_that_exits_fails_only_its_event(engine, async_engine, tenant,
                                                       outbox_clean):
    """A route that called sys.exit() (or raised another BaseException) ended the relay
    process, with exit code 3 and not a line logged; restarted, it met the same event
    first and exited again, so no event behind it was ever relayed."""
    routes = RouteRegistry()

    @routes.route("order.placed", name="exits")
    def exits(event: Event) -> JobRequest:
        match event.payload["n"]:
            case 1:
                sys.exit(3)
            case 2:
                raise OwnBaseException("stop everything")
        return JobRequest("reindex", {"n": event.payload["n"]})

    with engine.begin() as conn:
        ids = [emit(conn, "order.placed", {"n": n}, tenant_id=tenant, aggregate_type="order",
                    aggregate_id=n) for n in range(4)]
    result = await Relay(async_engine, routes).run_once()
    assert (result.handled, result.jobs, result.failed) == (2, 2, 2)
    with engine.connect() as conn:
        errors = dict(conn.execute(text(
            "SELECT id, last_error FROM mdm.aa_outbox_event WHERE handled_at IS NULL")).all())
    assert errors == {ids[1]: "SystemExit: 3", ids[2]: "OwnBaseException: stop everything"}


async def test_an_event_python_cannot_read_fails_only_itself(engine, async_engine, tenant,
                                                              outbox_clean):
    """An integer longer than Python converts, or nesting deeper than its decoder goes,
    which SQL written by hand can put in an event's payload or headers: reading the batch
    raised, so every batch that claimed the event failed and the relay relayed nothing."""
    with engine.begin() as conn:
        ids = [emit(conn, "order.placed", {"n": n}, tenant_id=tenant, aggregate_type="order",
                    aggregate_id=n) for n in (10, 11, 12)]
        conn.execute(text("UPDATE mdm.aa_outbox_event SET payload = CAST(:p AS jsonb) "
                          "WHERE id = :id"), {"p": '{"n": ' + "7" * 5000 + "}", "id": ids[0]})
        conn.execute(text("UPDATE mdm.aa_outbox_event SET headers = CAST(:h AS jsonb) "
                          "WHERE id = :id"), {"h": '{"h": ' + "[" * 3000 + "]" * 3000 + "}",
                                              "id": ids[1]})
    result = await Relay(async_engine, odd_routes()).run_once()
    assert (result.handled, result.jobs, result.failed) == (1, 1, 2)
    with engine.connect() as conn:
        rows = {row.id: row for row in conn.execute(text(
            "SELECT id, handled_at, attempts, last_error FROM mdm.aa_outbox_event"))}
    assert rows[ids[2]].handled_at is not None
    for failed in ids[:2]:
        assert rows[failed].handled_at is None and rows[failed].attempts == 1
        assert "payload or headers cannot be read" in rows[failed].last_error
    assert "4300 digits" in rows[ids[0]].last_error
    assert "RecursionError" in rows[ids[1]].last_error
