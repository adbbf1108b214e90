"""`postrelay emails unsuppress` (a real process) while a soft bounce of the same address is
being recorded: the lift starts the address's count afresh, so the outcome is the one of
either order (bounce then lift, or lift then bounce): the address gets mail again. The
bounce's count, read before the lift and applied after it, suppressed it again at once."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text

from postrelay.orchestrator.feedback import Feedback, Recorded
from tests.feedback.conftest import Look, insert_log, record
from tests.feedback.test_inbound_processes import POSTRELAY
from tests.feedback.test_recording_conflicts import waiting_for

ANN = "ann@example.com"


def soft_bounce(log_id: uuid.UUID, n: int) -> Feedback:
    return Feedback(kind="soft-bounced", source="mail", recipient=ANN, status="4.2.2",
                    log_id=log_id, source_event_id=f"full-{n}")


def waiting_for_advisory(engine: Engine) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' "
            "AND datname = current_database()")).scalar_one())


def test_a_lift_during_a_soft_bounce_that_reaches_the_limit_stands(
        worker_env: dict[str, str], engine: Engine, tenant: uuid.UUID, look: Look) -> None:
    with engine.begin() as conn:
        logs = [insert_log(conn, tenant_id=tenant, recipients=(ANN,)) for _ in range(4)]
    for n in range(3):  # the limit: suppressed
        record(engine, soft_bounce(logs[n]["id"], n))
    assert (ANN, "") in look.suppressed(tenant)
    fourth = soft_bounce(logs[3]["id"], 3)
    done: list[Recorded] = []
    with engine.connect() as other:
        # Holds the fourth's feedback row: its recording waits there, its count read.
        other.execute(text("INSERT INTO mdm.aa_email_feedback (kind, source, dedupe_key) "
                           "VALUES ('delivered', 'test', :key)"), {"key": fourth.dedupe_key()})
        recording = threading.Thread(target=lambda: done.append(record(engine, fourth)))
        recording.start()
        deadline = time.monotonic() + 20
        while not waiting_for(engine, other):
            assert time.monotonic() < deadline, "the recording never waited"
            time.sleep(0.01)
        lift = subprocess.Popen([str(POSTRELAY), "emails", "unsuppress", ANN, "--tenant",
                                 str(tenant)], env=worker_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while lift.poll() is None and not waiting_for_advisory(engine):  # ends, or waits
            assert time.monotonic() < deadline, "the lift neither ended nor waited"
            time.sleep(0.01)
        other.rollback()  # the recording goes on
    recording.join(30)
    out, err = lift.communicate(timeout=60)
    assert lift.returncode == 0, (out, err)
    assert out.strip() == f"{ANN} gets mail again"
    (recorded,) = done
    assert not recorded.duplicate
    assert look.suppressed(tenant) == {}


def test_a_soft_bounce_recorded_after_a_lift_began_waiting_is_not_counted_after_it(
        engine: Engine, tenant: uuid.UUID, look: Look) -> None:
    """Two soft bounces of a full mailbox in a burst, and the operator's lift while they
    are recorded: the second waits for the first, the lift for the second. The second is
    recorded before the lift is, so the lift starts the count afresh after it too. The
    lift's time was its transaction's start, before it waited, and the second's time is
    later: it still counted, and the next bounce after the lift suppressed at once."""
    from postrelay.orchestrator import SuppressionPolicy, suppression_remove

    policy = SuppressionPolicy(soft_limit=2, soft_window_secs=3600)
    with engine.begin() as conn:
        logs = [insert_log(conn, tenant_id=tenant, recipients=(ANN,)) for _ in range(4)]
    assert not record(engine, soft_bounce(logs[0]["id"], 0), policy).suppressed
    first, second = soft_bounce(logs[1]["id"], 1), soft_bounce(logs[2]["id"], 2)
    done: dict[str, Any] = {}

    def run(name: str, work: Callable[[], Any]) -> threading.Thread:
        thread = threading.Thread(target=lambda: done.__setitem__(name, work()))
        thread.start()
        return thread

    def lift() -> list[str]:
        with engine.begin() as conn:
            return suppression_remove(conn, ANN, tenant_id=tenant, actor="support")

    def until(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 20
        while not condition():
            assert time.monotonic() < deadline, what
            time.sleep(0.01)

    with engine.connect() as other:
        # Holds the first's feedback row: its recording waits there, holding the address.
        other.execute(text("INSERT INTO mdm.aa_email_feedback (kind, source, dedupe_key) "
                           "VALUES ('delivered', 'test', :key)"), {"key": first.dedupe_key()})
        threads = [run("first", lambda: record(engine, first, policy))]
        until(lambda: waiting_for(engine, other), "the first never waited")
        threads.append(run("second", lambda: record(engine, second, policy)))
        until(lambda: advisory_waiters(engine) == 1, "the second never waited")
        threads.append(run("lift", lift))
        until(lambda: advisory_waiters(engine) == 2, "the lift never waited")
        other.rollback()  # the first goes on, then the second, then the lift
    for thread in threads:
        thread.join(30)
    assert done["first"].suppressed and not done["second"].duplicate
    assert done["lift"] == [] and look.suppressed(tenant) == {}
    # The count starts afresh: one soft bounce is under the limit of two.
    assert not record(engine, soft_bounce(logs[3]["id"], 3), policy).suppressed
    assert look.suppressed(tenant) == {}


def advisory_waiters(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' "
            "AND datname = current_database()")).scalar_one())
