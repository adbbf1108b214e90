"""ensure_tenant finds a tenant without locking it: domain code that calls it early in a
long transaction must not hold up every other writer of that tenant's jobs and events
(their foreign-key checks take a KEY SHARE lock on the tenant row) until it commits. Two
transactions that create the same new tenant still get one tenant."""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import Engine, text

from postrelay.queue import enqueue, ensure_tenant
from postrelay.relay import emit


def waiting(engine: Engine) -> Any:
    """A connection in a transaction that gives up on a lock after a second."""
    conn = engine.connect()
    conn.begin()
    conn.execute(text("SET LOCAL lock_timeout = '1s'"))
    return conn


def test_an_open_transaction_that_found_a_tenant_holds_nobody_up(engine, tenant):
    # ON CONFLICT DO UPDATE locked the found row FOR UPDATE until the caller committed:
    # the enqueue beside it failed with "canceling statement due to lock timeout".
    with engine.connect() as holder, holder.begin():
        assert ensure_tenant(holder, "acme") == tenant
        other = waiting(engine)
        try:
            enqueue(other, "reindex", {}, tenant_id=tenant)
            emit(
                other, "order.placed", {}, tenant_id=tenant, aggregate_type="order", aggregate_id=1
            )
            assert ensure_tenant(other, "acme") == tenant
            other.commit()
        finally:
            other.close()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job")).scalar_one() == 1


def test_two_transactions_creating_one_tenant_get_the_same_one(engine, clean_db):
    found: list[Any] = []
    with engine.connect() as first, first.begin():
        created = ensure_tenant(first, "globex")
        racer = threading.Thread(target=lambda: found.append(_ensure_committed(engine)))
        racer.start()
        racer.join(0.3)
        assert racer.is_alive()  # waits for the first to decide
    racer.join(5)
    assert found == [created]
    # A creator that rolls back leaves the name to the next.
    with engine.connect() as first:
        first.begin()
        ensure_tenant(first, "initech")
        racer = threading.Thread(target=lambda: found.append(_ensure_committed(engine, "initech")))
        racer.start()
        racer.join(0.3)
        first.rollback()
    racer.join(5)
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT id FROM mdm.aa_tenant WHERE name = 'initech'"))
        assert found[1:] == [stored.scalar_one()]


def _ensure_committed(engine: Engine, name: str = "globex") -> Any:
    with engine.begin() as conn:
        return ensure_tenant(conn, name)
