"""Email routes through the real relay, and what operators do with the log afterwards:
retention, template fixes retried from the DLQ, `postrelay emails`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import NoResultFound

from postrelay.orchestrator import email_route
from postrelay.queue.admin import dlq_retry
from postrelay.queue.maintenance.retention import delete_done_before
from postrelay.relay import Relay, RouteRegistry, emit
from postrelay.relay.admin import outbox_replay
from postrelay.relay.routing import Event
from tests.orchestrator.conftest import write_template

POSTRELAY = str(Path(sys.executable).parent / "postrelay")


def email_jobs(engine) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(
            "SELECT id, tenant_id, priority, idempotency_key, payload FROM mdm.aa_job "
            "WHERE job_kind = 'email_send' ORDER BY idempotency_key")).mappings()]


def signed_up(engine, tenant, email, **extra) -> object:
    with engine.begin() as conn:
        return emit(conn, "user.signed_up", {"user": {"name": "Ann", "email": email}, **extra},
                    tenant_id=tenant, aggregate_type="user", aggregate_id=email)


async def test_routes_turn_events_into_one_job_per_message_exactly_once(
    engine, async_engine, tenant, clean_db
):
    from postrelay.queue import ensure_tenant

    with engine.begin() as conn:
        other = ensure_tenant(conn, "globex")
    routes = RouteRegistry()
    email_route("user.signed_up", template="welcome", to="user.email",
                cc=lambda e: e.payload.get("manager"), bcc="audit@acme.example",
                sender="Acme <noreply@acme.example>", category="onboarding", priority=20,
                routes=routes)
    email_route("user.signed_up", template="team_welcome", to="team", split=True,
                tenants=[tenant], routes=routes)
    event_id = signed_up(engine, tenant, "ann@example.com", manager="boss@example.com",
                         team=["a@example.com", "b@example.com"])
    signed_up(engine, other, "zed@example.com", team=["c@example.com"])
    relay = Relay(async_engine, routes)
    assert (await relay.run_once()).jobs == 4
    jobs = email_jobs(engine)
    keys = [j["idempotency_key"] for j in jobs]
    assert f"outbox:{event_id}:email:welcome" in keys
    assert f"outbox:{event_id}:email:team_welcome:0" in keys
    assert f"outbox:{event_id}:email:team_welcome:1" in keys
    welcome = next(j for j in jobs if j["idempotency_key"] == f"outbox:{event_id}:email:welcome")
    payload = welcome["payload"]
    assert (payload["to"], payload["cc"], payload["bcc"]) == (
        ["ann@example.com"], ["boss@example.com"], ["audit@acme.example"])
    assert payload["from"] == "Acme <noreply@acme.example>"
    assert payload["category"] == "onboarding" and welcome["priority"] == 20
    assert payload["event_id"] == str(event_id)
    assert payload["context"]["user"]["name"] == "Ann"
    assert payload["context"]["event"]["type"] == "user.signed_up"
    # The per-tenant route ignored the other tenant's team.
    assert sorted(tuple(j["payload"]["to"]) for j in jobs if "team" in j["idempotency_key"]) \
        == [("a@example.com",), ("b@example.com",)]

    with engine.begin() as conn:
        assert outbox_replay(conn, event_id=event_id) == 1
    assert (await relay.run_once()).handled == 1
    assert email_jobs(engine) == jobs  # a replay never makes a second message


async def test_an_event_without_the_recipient_path_is_isolated_not_lost(
    engine, async_engine, tenant, clean_db
):
    """Its message alone fails (tests/orchestrator/test_route_recipients.py); once the
    route is fixed, a replay of the event makes the message."""
    routes = RouteRegistry()
    email_route("user.signed_up", template="welcome", to="user.mail", routes=routes)
    bad = signed_up(engine, tenant, "ann@example.com")
    result = await Relay(async_engine, routes).run_once()
    assert (result.handled, result.failed) == (1, 0)
    [job] = email_jobs(engine)
    assert job["idempotency_key"] == f"outbox:{bad}:email:welcome:unroutable"
    assert job["payload"]["unroutable"] == {
        "field": "to", "rule": "the event payload has no 'user.mail'"}

    fixed = RouteRegistry()
    email_route("user.signed_up", template="welcome", to="user.email", routes=fixed)
    with engine.begin() as conn:
        assert outbox_replay(conn, event_id=bad) == 1
    assert (await Relay(async_engine, fixed).run_once()).jobs == 1
    assert [j["payload"]["to"] for j in email_jobs(engine)] == [["ann@example.com"], []]


def test_a_route_needs_a_template_and_recipients():
    from postrelay.core.errors import ValidationError

    with pytest.raises(ValidationError, match="template"):
        email_route("x", template="", to="a@example.com", routes=RouteRegistry())
    with pytest.raises(ValidationError, match="to"):
        email_route("x", template="t", to=None, routes=RouteRegistry())
    routes = RouteRegistry()
    email_route("x", template="t", to=lambda e: 42, routes=routes)  # type: ignore[arg-type]
    [route] = routes.matching("x")
    event = Event(__import__("uuid").uuid4(), __import__("uuid").uuid4(), "a", "1", "x", {}, {},
                  datetime.now(UTC), 0, 1)
    # The event's data: its message fails by itself (test_route_recipients.py).
    [request] = route.requests(event)
    assert "must resolve to an address" in request.payload["unroutable"]["rule"]


@pytest.mark.parametrize(("options", "field"), [
    ({"template": 7}, "template"),
    ({"template": "../secrets"}, "template"),
    ({"template": "x" * 300}, "template"),
    ({"sender": "not an address"}, "sender"),
    ({"sender": "Acme <noreply@acme.example>\r\nBcc: all@evil.example"}, "sender"),
    ({"to": "nobody@"}, "to"),
    ({"to": ["ann@example.com", "not an address"]}, "to[1]"),
    ({"cc": "a@b@c"}, "cc"),
    ({"reply_to": ["ok@example.com", 7]}, "reply_to[1]"),
    ({"priority": 100_000}, "priority"),
    ({"priority": "high"}, "priority"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"tenants": ["acme"]}, "tenants"),
    ({"tenants": "01a24f8f-c3a4-7b70-a654-d6e2b322fcb3"}, "tenants"),
    ({"split": "yes"}, "split"),
])
def test_a_route_option_no_job_could_carry_is_refused_when_registered(options, field):
    """Accepted, a bad one failed every matching event at run time (retried until dead,
    its webhooks with it: a priority outside smallint, max_attempts 0) or every message
    the route made (a sender or a literal address that is not one)."""
    from postrelay.core.errors import ValidationError

    given = {"template": "welcome", "to": "user.email", **options}
    with pytest.raises(ValidationError) as caught:
        email_route("x", routes=RouteRegistry(), **given)
    assert caught.value.field == field


@pytest.mark.parametrize("marks", [{"split": True}, {"unsubscribe": True}])
def test_a_mailbox_named_twice_gets_one_message_when_each_address_gets_its_own(marks):
    """A list naming one mailbox twice (the same address, or it in another case) sent it
    two messages. Each message keeps the key of its address's position, as before."""
    import uuid

    routes = RouteRegistry()
    email_route("x", template="t", to="team", routes=routes, **marks)
    [route] = routes.matching("x")
    team = ["ann@example.com", "Bob <bob@example.com>", "ANN@Example.com", "ann@example.com",
            "BOB@example.COM", "not an address", "not an address", "cy@example.com"]
    event = Event(uuid.uuid4(), uuid.uuid4(), "a", "1", "x", {"team": team}, {},
                  datetime.now(UTC), 0, 1)
    sent = [(r.key, r.payload["to"]) for r in route.requests(event)]
    assert sent == [("0", ["ann@example.com"]), ("1", ["Bob <bob@example.com>"]),
                    ("5", ["not an address"]), ("7", ["cy@example.com"])]


async def test_job_retention_keeps_the_log_and_the_job_id_it_names(rig, tenant):
    job_id = rig.enqueue(tenant)
    await rig.start()
    await rig.settle(job_id)
    deleted = await delete_done_before(rig.async_engine, datetime.now(UTC) + timedelta(days=1))
    assert deleted >= 1
    with pytest.raises(NoResultFound):
        rig.job(job_id)
    [row] = rig.log()  # the log outlives the job, and still says which job it was
    assert row["job_id"] == job_id and row["status"] == "sent"
    assert row["message_id"] == f"<{job_id}@mail.acme.example>"


async def test_a_fixed_template_and_a_dlq_retry_send_the_fixed_mail(rig, tenant, sink,
                                                                     templates_dir):
    write_template(templates_dir, "digest", "Digest", "{{ stats.orders }} orders\n")
    job_id = rig.enqueue(tenant, template="digest")
    await rig.start()
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "dlq"
    [failed] = rig.log(job_id)
    assert failed["status"] == "failed" and "'stats' is undefined" in failed["error"]

    write_template(templates_dir, "digest", "Digest", "No stats this week.\n")
    with rig.engine.begin() as conn:
        dlq_retry(conn, job_id, actor="operator")
    await rig.settle(job_id)
    rows = rig.log(job_id)
    assert [r["status"] for r in rows] == ["failed", "sent"]
    assert rows[0]["template_version"] != rows[1]["template_version"]
    [received] = sink.handler.received
    assert "No stats this week." in received.message.get_content()


async def test_the_emails_command_lists_and_tells_one_message_s_story(
    rig, tenant, sink, worker_env
):
    sink.handler.rules = [("busy@example.com", __import__(
        "postrelay.testing", fromlist=["reply"]).reply("451 4.3.0 Busy"))]
    job_id = rig.enqueue(tenant, to=["busy@example.com"], max_attempts=2)
    other = rig.enqueue(tenant, to=["ann@example.com"])
    await rig.start()
    await rig.settle(job_id, other)

    def postrelay(*args: str) -> str:
        done = subprocess.run([POSTRELAY, *args], env=worker_env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = json.loads(postrelay("emails", "--recipient", "BUSY@example.com", "--json"))
    assert [r["status"] for r in listed] == ["deferred", "deferred"]
    assert all(r["job_id"] == str(job_id) for r in listed)
    table = postrelay("emails", "--status", "sent", "--since", "1h")
    assert "ann@example.com" in table and "busy@example.com" not in table

    story = postrelay("emails", "show", listed[0]["id"])
    assert f"job {job_id}  dlq  attempt 2/2" in story
    assert story.count("deferred") == 2 and "451 4.3.0" in story
    assert "job_dlq by" in story  # the audit trail
    # Times as every table shows them, not as ISO strings with microseconds.
    assert re.search(r"#1 \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ ", story), story
    assert re.search(r"audit \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ ", story), story
    as_json = json.loads(postrelay("emails", "show", listed[0]["id"], "--json"))
    assert as_json["job"]["id"] == str(job_id) and len(as_json["attempts"]) == 2

    done = subprocess.run([POSTRELAY, "emails", "--status", "nope"], env=worker_env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "status" in done.stderr
    # A span past the calendar named the field no more than a wrong word does: it was an
    # unexpected OverflowError.
    for command in (["emails", "--since", "999999d"], ["feedback", "list", "--since", "999999d"],
                    ["emails", "--until", "100000000000s"]):
        done = subprocess.run([POSTRELAY, *command], env=worker_env, capture_output=True,
                              text=True, timeout=60)
        field = command[-2].lstrip("-")
        assert done.returncode == 1 and f"{field}: must be" in done.stderr, done.stderr
        assert "unexpected" not in done.stderr
    # Given empty (`--tenant "$T"` with T unset), a filter listed every tenant's mail.
    for command in (["emails", "--tenant", ""], ["emails", "--until", " "],
                    ["emails", "--job", ""], ["emails", "suppressed", "--tenant", ""]):
        done = subprocess.run([POSTRELAY, *command], env=worker_env, capture_output=True,
                              text=True, timeout=60)
        field = command[-2]
        assert (done.returncode, done.stdout) == (1, ""), command
        assert f"error: {field}: must be" in done.stderr and "not empty" in done.stderr, \
            done.stderr


async def test_operators_list_and_lift_suppressions(rig, tenant, sink, worker_env):
    from postrelay.testing import reply

    sink.handler.rules = [("gone@example.com", reply("550 5.1.1 No such user"))]
    bounced = rig.enqueue(tenant, to=["gone@example.com"])
    await rig.start()
    await rig.settle(bounced)

    def postrelay(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([POSTRELAY, *args], env=worker_env, capture_output=True,
                              text=True, timeout=60)

    listed = json.loads(postrelay("emails", "suppressed", "--json").stdout)
    assert [(r["address"], r["smtp_enhanced"]) for r in listed] == [("gone@example.com",
                                                                      "5.1.1")]
    lifted = postrelay("emails", "unsuppress", "GONE@example.com", "--tenant", str(tenant))
    assert lifted.returncode == 0 and "gets mail again" in lifted.stdout
    again = postrelay("emails", "unsuppress", "gone@example.com", "--tenant", str(tenant))
    assert again.returncode == 1 and "not suppressed" in again.stderr

    sink.handler.rules = []  # the mailbox exists now
    later = rig.enqueue(tenant, to=["gone@example.com"])
    await rig.settle(later)
    assert [r["status"] for r in rig.log(later)] == ["sent"]
