"""What operators see of feedback: lifting a suppression leaves an audit row (the CLI, on a
real PostgreSQL)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

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

    made = {(r["kind"], r["id"]) for r in look.feedback() if r["suppressed"]}
    # The bounce is lifted (the mailbox exists again); the unsubscribe, the address's own
    # choice, stays until named.
    lifted = postrelay("emails", "unsuppress", "Ann@Example.com", "--tenant", str(tenant))
    assert lifted.returncode == 0, lifted.stderr
    assert "still suppressed in newsletter" in lifted.stdout
    assert set(look.suppressed(tenant)) == {(ANN, "newsletter")}
    again = postrelay("emails", "unsuppress", ANN, "--tenant", str(tenant))
    assert again.returncode == 1 and "is not suppressed for all mail for tenant" in again.stderr
    assert "suppressed in newsletter" in again.stderr
    resubscribed = postrelay("emails", "unsuppress", ANN, "--tenant", str(tenant),
                             "--category", "newsletter")
    assert resubscribed.returncode == 0, resubscribed.stderr
    assert "gets newsletter mail again" in resubscribed.stdout
    assert look.suppressed(tenant) == {}
    # The reports that suppressed still say so, after the rows that named them are gone.
    assert {(r["kind"], r["id"]) for r in look.feedback() if r["suppressed"]} == made
    assert {kind for kind, _ in made} == {"bounced", "unsubscribe"}
    audits = look.rows("SELECT * FROM mdm.aa_email_suppression_audit ORDER BY id")
    assert [(a["tenant_id"], a["address"], a["action"]) for a in audits] == [
        (tenant, ANN, "unsuppress")] * 2
    assert all(a["actor"].startswith("cli:") for a in audits)
    assert [[(w["category"], w["source"]) for w in a["detail"]["lifted"]] for a in audits] == [
        [("", "sendgrid")], [("newsletter", "one-click")]]
    assert "5.1.1" in audits[0]["detail"]["lifted"][0]["reason"]
    # Lifting what is not suppressed is refused and audits nothing.
    for category in ((), ("--category", "newsletter")):
        again = postrelay("emails", "unsuppress", ANN, "--tenant", str(tenant), *category)
        assert again.returncode == 1 and "is not" in again.stderr
    shown = json.loads(postrelay("emails", "suppressed", "--lifted", "--json").stdout)
    assert [(r["address"], r["actor"]) for r in shown] == [(ANN, audits[0]["actor"])] * 2
    table = postrelay("emails", "suppressed", "--lifted", "--tenant", str(tenant)).stdout
    assert ANN in table and "newsletter" in table



def test_suppressed_finds_one_address_in_every_tenant_and_category(
        engine, tenant, other_tenant, look, worker_env):
    with engine.begin() as conn:
        for who in (tenant, other_tenant):
            for i, address in enumerate((ANN, "bob@example.com")):
                record_feedback(conn, Feedback(
                    kind="unsubscribe", source="one-click", recipient=address, tenant_id=who,
                    category="newsletter", vouched=True, source_event_id=f"u-{who}-{i}"))
        record_feedback(conn, Feedback(kind="complaint", source="postmark", recipient=ANN,
                                       tenant_id=tenant, vouched=True, source_event_id="c-1"))

    def shown(*args: str) -> list[tuple[str, str, str]]:
        done = subprocess.run([POSTRELAY, "emails", "suppressed", "--json", *args],
                              env=worker_env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return sorted((str(r["tenant_id"]), r["address"], r.get("category", ""))
                      for r in json.loads(done.stdout))

    assert shown("--address", " Ann@Example.com ") == sorted([
        (str(tenant), ANN, ""), (str(tenant), ANN, "newsletter"),
        (str(other_tenant), ANN, "newsletter")])
    assert shown("--address", ANN, "--tenant", str(other_tenant)) == [
        (str(other_tenant), ANN, "newsletter")]
    assert shown("--address", "carol@example.com") == []
    assert len(shown()) == 5
    # The audit of lifted suppressions, narrowed the same way.
    subprocess.run([POSTRELAY, "emails", "unsuppress", "bob@example.com", "--tenant",
                    str(tenant), "--category", "newsletter"], env=worker_env, check=True,
                   capture_output=True, timeout=60)
    assert [r[1] for r in shown("--lifted", "--address", "BOB@example.com")] == [
        "bob@example.com"]
    assert shown("--lifted", "--address", ANN) == []

def _answered(engine, tenant, n, *, age_days=0.0, status="sent"):
    """n log rows answered `age_days` ago, one recipient each."""
    with engine.begin() as conn:
        rows = [insert_log(conn, tenant_id=tenant, recipients=(f"r{i}-{age_days}@example.com",),
                           status=status) for i in range(n)]
        conn.execute(text("UPDATE mdm.aa_email_log SET created_at = now() - make_interval("
                          "secs => :s) WHERE id = ANY(:ids)"),
                     {"s": age_days * 86400, "ids": [r["id"] for r in rows]})
    return rows


def _feedback(engine, row, kind, source, event_id, status=None):
    with engine.begin() as conn:
        record_feedback(conn, Feedback(
            kind=kind, source=source, recipient=None, status=status,
            source_event_id=event_id, message_id=row["message_id"]))


def _clicked(engine, tenant):
    """An unsubscribe through a signed link: it names the tenant and recipient, no message."""
    with engine.begin() as conn:
        return record_feedback(conn, Feedback(
            kind="unsubscribe", source="one-click", recipient=ANN, tenant_id=tenant,
            category="news", vouched=True, source_event_id="click-1"))


def test_a_signed_link_unsubscribe_is_not_unmatched(engine, tenant, worker_env):
    """It names no message, and was listed with the forged reports for an operator to
    look at, each click of every bulk mailing."""
    from postrelay.orchestrator import feedback_list

    clicked = _clicked(engine, tenant)
    assert (clicked.matched_by, clicked.suppressed) == ("token", True)
    _feedback(engine, {"message_id": "<nobody@elsewhere.example>"}, "bounced", "mail", "f1",
              "5.1.1")
    with engine.connect() as conn:
        unmatched = feedback_list(conn, unmatched=True)
    assert [(r["kind"], r["source"]) for r in unmatched] == [("bounced", "mail")]
    shown = subprocess.run([POSTRELAY, "feedback", "list", "--kind", "unsubscribe"],
                           env=worker_env, capture_output=True, text=True, check=True,
                           timeout=60)
    assert "signed link" in shown.stdout and "unmatched" not in shown.stdout


def test_an_empty_tenant_or_since_is_refused_not_taken_for_no_filter(engine, tenant,
                                                                    worker_env):
    """`--tenant "$T"` with T unset listed every tenant's feedback, and `--since ""` every
    report ever received, as if the option had been left out."""
    _feedback(engine, _answered(engine, tenant, 1)[0], "bounced", "mail", "b-1", "5.1.1")
    for option, message in (("--tenant", "error: --tenant: must be a UUID, not empty"),
                            ("--since", "error: --since: must be like 30m, 2h, 7d or an ISO "
                                        "8601 time, not empty")):
        shown = subprocess.run([POSTRELAY, "feedback", "list", option, ""], env=worker_env,
                               capture_output=True, text=True, timeout=60)
        assert (shown.returncode, shown.stdout, shown.stderr) == (1, "", message + "\n")


def test_an_empty_category_lifts_nothing_rather_than_every_suppression(engine, tenant, look,
                                                                       worker_env):
    """`unsuppress --category "$C"` with C unset lifted the complaint that stops all of the
    address's mail, where one category's unsubscribe was meant: mail to a complainer."""
    from postrelay.core.errors import ValidationError
    from postrelay.orchestrator import suppression_remove

    with engine.begin() as conn:
        record_feedback(conn, Feedback(kind="complaint", source="postmark", recipient=ANN,
                                       tenant_id=tenant, vouched=True, source_event_id="c-1"))
        record_feedback(conn, Feedback(kind="unsubscribe", source="one-click", recipient=ANN,
                                       tenant_id=tenant, category="news", vouched=True,
                                       source_event_id="u-1"))
    before = set(look.suppressed(tenant))
    for category in ("", " "):
        done = subprocess.run([POSTRELAY, "emails", "unsuppress", ANN, "--tenant", str(tenant),
                               "--category", category], env=worker_env, capture_output=True,
                              text=True, timeout=60)
        assert (done.returncode, done.stdout) == (1, ""), done.stderr
        assert done.stderr.startswith("error: --category: must name a category")
    with engine.begin() as conn, pytest.raises(ValidationError, match="category"):
        suppression_remove(conn, ANN, tenant_id=tenant, actor="app", category="  ")
    assert set(look.suppressed(tenant)) == before == {(ANN, ""), (ANN, "news")}
    assert look.rows("SELECT * FROM mdm.aa_email_suppression_audit") == []


def test_rates_per_tenant_over_24_hours_and_7_days(engine, tenant, other_tenant, look):
    from postrelay.orchestrator import feedback_rates

    today = _answered(engine, tenant, 10)
    week = _answered(engine, tenant, 10, age_days=3)
    _answered(engine, tenant, 5, age_days=9)  # outside both windows
    refused = _answered(engine, tenant, 1, status="bounced")  # 5xx at send time
    _answered(engine, tenant, 3, status="deferred")  # not answered yet: not counted
    _feedback(engine, today[0], "bounced", "sendgrid", "b1", "5.1.1")
    _feedback(engine, today[1], "complaint", "ses", "c1")
    _feedback(engine, week[0], "bounced", "mail", "b2", "5.1.1")
    _feedback(engine, week[1], "soft-bounced", "mail", "s1", "4.2.2")  # not a bounce
    _answered(engine, other_tenant, 4)
    with engine.connect() as conn:
        rates = {r["tenant_id"]: r for r in feedback_rates(conn)}
        mine = feedback_rates(conn, tenant_id=tenant)
    assert [r["tenant_id"] for r in mine] == [tenant]
    acme = rates[tenant]
    assert (acme["messages_24h"], acme["bounced_24h"], acme["complained_24h"]) == (11, 2, 1)
    assert (acme["messages_7d"], acme["bounced_7d"], acme["complained_7d"]) == (21, 3, 1)
    assert acme["bounce_rate_24h"] == 2 / 11 and acme["complaint_rate_7d"] == 1 / 21
    assert look.log(refused[0]["id"])["delivery"] is None  # counted by its SMTP status
    other = rates[other_tenant]
    assert (other["messages_24h"], other["bounce_rate_24h"], other["complaint_rate_24h"]) == (
        4, 0.0, 0.0)


def test_metrics_export_feedback_counts_and_rates(database_url, engine, tenant, look):
    from prometheus_client.parser import text_string_to_metric_families

    from tests.api.server import serve_database

    sent = _answered(engine, tenant, 4)
    _feedback(engine, sent[0], "bounced", "postmark", "m1", "5.1.1")
    _feedback(engine, sent[1], "complaint", "sendgrid", "m2")
    _feedback(engine, {"message_id": "<nobody@elsewhere.example>"}, "bounced", "mail", "m3",
              "5.1.1")
    _clicked(engine, tenant)
    with engine.begin() as conn:  # two messages the inbound receiver has not recorded yet
        conn.execute(text("INSERT INTO mdm.aa_feedback_inbox (envelope_to, raw, received_at) "
                          "VALUES ('{a@b.example}', 'x', now() - interval '90 seconds'), "
                          "('{a@b.example}', 'y', now())"))
    key = "svc-key-for-the-feedback-metrics-test-0001"
    with serve_database(database_url, key) as url:
        scraped = httpx.get(f"{url}/metrics", headers={"apikey": key}, timeout=30)
    assert scraped.status_code == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(scraped.text)
               for s in family.samples}
    assert samples[("postrelay_email_feedback_24h",
                    (("kind", "bounced"), ("source", "postmark")))] == 1
    assert samples[("postrelay_email_feedback_24h",
                    (("kind", "complaint"), ("source", "sendgrid")))] == 1
    assert samples[("postrelay_email_feedback_unmatched_24h",
                    (("kind", "bounced"), ("source", "mail")))] == 1
    assert samples[("postrelay_email_feedback_unmatched_24h",
                    (("kind", "unsubscribe"), ("source", "one-click")))] == 0
    labels = (("tenant", "acme"), ("tenant_id", str(tenant)), ("window", "24h"))
    assert samples[("postrelay_email_bounce_rate", labels)] == 0.25
    assert samples[("postrelay_email_complaint_rate", labels)] == 0.25
    assert samples[("postrelay_email_answered", labels)] == 4
    assert samples[("postrelay_feedback_inbox", ())] == 2
    assert samples[("postrelay_feedback_inbox_oldest_age_seconds", ())] >= 90
