"""Feedback fixtures: email log rows built directly, and readers of what feedback left."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import string
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg.sql import Literal
from sqlalchemy import Connection, Engine, TextClause, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from postrelay.core.db import sqlalchemy_url
from postrelay.orchestrator import ReturnPath, feedback_list
from postrelay.orchestrator.admin import MAX_LIMIT
from postrelay.orchestrator.feedback import Feedback, Recorded, SuppressionPolicy, record_feedback
from postrelay.orchestrator.feedback.inbound import InboundConfig, InboundServer

# The email rig (templates, an SMTP sink, workers with the real handler).
from tests.orchestrator.conftest import rig, sink, templates_dir  # noqa: F401


def insert_log(conn: Connection, *, tenant_id: uuid.UUID, recipients: tuple[str, ...] =
               ("ann@example.com",), status: str = "sent", job_id: uuid.UUID | None = None,
               queue_id: str | None = None, category: str | None = None,
               message_id: str | None = None, attempt: int = 1,
               log_id: uuid.UUID | None = None) -> dict[str, Any]:
    log_id = log_id or uuid.uuid4()
    job_id = job_id or uuid.uuid4()  # every attempt is some job's; the log keeps its id
    message_id = message_id or f"<{job_id}@mail.acme.example>"
    conn.execute(text(
        "INSERT INTO mdm.aa_email_log (id, tenant_id, job_id, template, category, "
        "from_address, recipients, to_addresses, subject, message_id, status, queue_id, "
        "attempt) VALUES (:id, :tenant, :job, 'welcome', :category, 'noreply@acme.example', "
        ":recipients, :recipients, 'Hi', :mid, :status, :queue_id, :attempt)"),
        {"id": log_id, "tenant": tenant_id, "job": job_id, "category": category,
         "recipients": list(recipients), "mid": message_id, "status": status,
         "queue_id": queue_id, "attempt": attempt})
    return {"id": log_id, "message_id": message_id, "job_id": job_id}


async def await_inbox_empty(engine: Engine, timeout: float = 10.0) -> None:
    """Wait until the inbound receiver has recorded every message of its inbox (its 250
    says only that a message is stored)."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            waiting = conn.execute(text("SELECT count(*) FROM mdm.aa_feedback_inbox")
                                   ).scalar_one()
        if waiting == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{waiting} messages still in the inbox after {timeout}s")
        await asyncio.sleep(0.02)



def record(engine: Engine, feedback: Feedback,
           policy: SuppressionPolicy = SuppressionPolicy()) -> Recorded:
    """Record one report in a transaction of its own."""
    with engine.begin() as conn:
        return record_feedback(conn, feedback, policy)

def generic_plan(engine: Engine, statement: TextClause, params: dict[str, Any],
                 grow: Callable[[], None]) -> dict[str, Any]:
    """The plan a statement runs with in `postrelay inbound` (prepared once, planned
    generically on its first run) after `grow` filled its tables since that first run, as
    they fill while a receiver runs: executed with `params` and rolled back, EXPLAIN's
    JSON top node."""
    sql = str(statement.compile(dialect=engine.dialect))
    for i, name in enumerate(params, 1):
        sql = sql.replace(f"%({name})s", f"${i}")
    with engine.connect() as conn:
        driver = conn.connection.driver_connection
        values = ", ".join(Literal(value).as_string(driver) for value in params.values())
        conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        conn.exec_driver_sql(f"PREPARE under_test AS {sql}")
        try:
            conn.exec_driver_sql(f"EXECUTE under_test({values})")  # planned here
            conn.rollback()
            grow()
            plan = conn.exec_driver_sql(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE under_test({values})"
            ).scalar_one()
        finally:
            conn.rollback()  # nothing it did is kept; the session is left as found
            conn.exec_driver_sql("DEALLOCATE under_test")
            conn.exec_driver_sql("RESET plan_cache_mode")
            conn.commit()
    return plan[0]["Plan"]  # type: ignore[no-any-return]


def node_types(plan: dict[str, Any]) -> list[str]:
    """Every node of a plan, by type (a scan's relation after it: `Seq Scan on aa_job`)."""
    found = [" on ".join(filter(None, (plan["Node Type"], plan.get("Relation Name"))))]
    for child in plan.get("Plans", ()):
        found += node_types(child)
    return found


class Look:
    """Reads back the feedback tables, the log, the suppression list and the outbox."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def rows(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(text(sql), params).mappings()]

    def feedback(self) -> list[dict[str, Any]]:
        """Oldest first, as operators read it (whether a report suppressed is read from the
        suppression that names it)."""
        with self.engine.connect() as conn:
            return feedback_list(conn, limit=MAX_LIMIT)[::-1]

    def log(self, log_id: uuid.UUID) -> dict[str, Any]:
        return self.rows("SELECT * FROM mdm.aa_email_log WHERE id = :id", id=log_id)[0]

    def suppressed(self, tenant: uuid.UUID) -> dict[tuple[str, str], dict[str, Any]]:
        return {(r["address"], r["category"]): r for r in self.rows(
            "SELECT * FROM mdm.aa_email_suppression WHERE tenant_id = :t", t=tenant)}

    def events(self) -> list[dict[str, Any]]:
        return self.rows("SELECT event_type, aggregate_type, aggregate_id, payload, tenant_id "
                         "FROM mdm.aa_outbox_event ORDER BY created_at, id")


@pytest.fixture
def look(engine: Engine, clean_db: None) -> Look:
    return Look(engine)


MAIL = Path(__file__).parent / "mail"
SECRET = b"0123456789abcdef-secret"
BOUNCE_DOMAIN = "bounces.acme.example"


def bounce_mail(name: str, **values: str) -> bytes:
    """A fixture from mail/ with its placeholders filled, CRLF line ends as on the wire."""
    values.setdefault("domain", BOUNCE_DOMAIN)
    values.setdefault("queue_id", "4F3A2B")
    values.setdefault("recipient", "ann@example.com")
    values.setdefault("other", "bob@example.com")  # a second recipient, where there is one
    filled = string.Template((MAIL / name).read_text()).substitute(values)
    return filled.replace("\r\n", "\n").replace("\n", "\r\n").encode()


@pytest.fixture
def return_path():
    from postrelay.orchestrator import ReturnPath

    return ReturnPath(BOUNCE_DOMAIN, SECRET)


@pytest.fixture
def other_tenant(engine: Engine, tenant: uuid.UUID) -> uuid.UUID:
    from postrelay.queue import ensure_tenant

    with engine.begin() as conn:
        return ensure_tenant(conn, "globex")  # type: ignore[return-value]



@pytest.fixture
def gone_tenant(engine: Engine, tenant: uuid.UUID) -> uuid.UUID:
    """A tenant made and deleted again: the log keeps the rows of its mail (no foreign key),
    so feedback about them, and its links in mail already out, still come."""
    from postrelay.queue import ensure_tenant

    with engine.begin() as conn:
        gone = ensure_tenant(conn, "initech")
        conn.execute(text("DELETE FROM mdm.aa_tenant WHERE id = :id"), {"id": gone})
    return gone  # type: ignore[return-value]

@pytest.fixture
def receiver_engine(database_url: str) -> Iterator[AsyncEngine]:
    """An async engine for an inbound listener: used on the listener's own event loop, so
    its connections are dropped, not closed, afterwards (that loop is gone by then)."""
    eng = create_async_engine(sqlalchemy_url(database_url), pool_pre_ping=False)
    yield eng
    eng.sync_engine.dispose(close=False)


async def until_listening(port: int, timeout: float = 30.0) -> None:
    """Until a `postrelay inbound` started as a process answers on `port`."""
    import aiosmtplib

    deadline = time.monotonic() + timeout
    while True:
        try:
            # Whether it answers, not whether this client trusts its certificate.
            smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=5,
                                   start_tls=False)
            await smtp.connect()
            await smtp.quit()
            return
        except (OSError, aiosmtplib.SMTPException):
            if time.monotonic() > deadline:
                raise AssertionError(f"postrelay inbound did not listen on {port}") from None
            await asyncio.sleep(0.1)


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports: every probe stays bound until all are chosen."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


@pytest.fixture
def inbound(receiver_engine: AsyncEngine, return_path: ReturnPath,
            clean_db: None) -> Iterator[InboundServer]:
    """`postrelay inbound` on a free loopback port: 1 MB messages, two connections."""
    config = InboundConfig(host="127.0.0.1", port=free_port(), max_bytes=1024 * 1024,
                           max_connections=2)
    with InboundServer(receiver_engine, return_path, SuppressionPolicy(), config) as server:
        yield server


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What the receiver's sessions hand their sockets, write by write (the listener runs
    on a thread of its own, the test on the main one)."""
    writes: list[bytes] = []
    write = asyncio.StreamWriter.write

    def recording(self: asyncio.StreamWriter, data: bytes) -> None:
        if threading.current_thread() is not threading.main_thread():
            writes.append(bytes(data))
        write(self, data)

    monkeypatch.setattr(asyncio.StreamWriter, "write", recording)
    return writes
