"""`postrelay emails unsuppress` (a real process) while a soft bounce of the same address is
being recorded: the lift starts the address's count afresh, so the outcome is the one of
either order (bounce then lift, or lift then bounce): the address gets mail again. The
bounce's count, read before the lift and applied after it, suppressed it again at once."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid

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
