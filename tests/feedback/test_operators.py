"""What operators see of feedback: lifting a suppression leaves an audit row (the CLI, on a
real PostgreSQL)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from postrelay.orchestrator.feedback import Feedback, record_feedback
from tests.feedback.conftest import insert_log

POSTRELAY = str(Path(sys.executable).parent / "postrelay")
ANN = "ann@example.com"


def test_unsuppress_writes_an_audit_row_with_what_was_lifted_and_by_whom(
        engine, tenant, look, worker_env):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, category="newsletter")
        record_feedback(conn, Feedback(kind="bounced", source="sendgrid", recipient=ANN,
                                       status="5.1.1", source_event_id="b-1",
                                       message_id=sent["message_id"]))
        record_feedback(conn, Feedback(kind="unsubscribe", source="one-click", recipient=ANN,
                                       tenant_id=tenant, category="newsletter", vouched=True,
                                       source_event_id="u-1"))
    assert set(look.suppressed(tenant)) == {(ANN, ""), (ANN, "newsletter")}

    def postrelay(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([POSTRELAY, *args], env=worker_env, capture_output=True,
                              text=True, timeout=60)

    lifted = postrelay("emails", "unsuppress", "Ann@Example.com", "--tenant", str(tenant))
    assert lifted.returncode == 0, lifted.stderr
    assert look.suppressed(tenant) == {}
    (audit,) = look.rows("SELECT * FROM mdm.aa_email_suppression_audit")
    assert (audit["tenant_id"], audit["address"], audit["action"]) == (tenant, ANN,
                                                                       "unsuppress")
    assert audit["actor"].startswith("cli:")
    assert [(w["category"], w["source"]) for w in audit["detail"]["lifted"]] == [
        ("", "sendgrid"), ("newsletter", "one-click")]
    assert "5.1.1" in audit["detail"]["lifted"][0]["reason"]
    # Lifting what is not suppressed is refused and audits nothing.
    again = postrelay("emails", "unsuppress", ANN, "--tenant", str(tenant))
    assert again.returncode == 1 and "not suppressed" in again.stderr
    shown = json.loads(postrelay("emails", "suppressed", "--lifted", "--json").stdout)
    assert [(r["address"], r["actor"]) for r in shown] == [(ANN, audit["actor"])]
    table = postrelay("emails", "suppressed", "--lifted", "--tenant", str(tenant)).stdout
    assert ANN in table and "newsletter" in table
