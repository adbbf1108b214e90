"""The messages a split or bulk route makes of one event share its payload: their jobs name
the event, and the worker reads the payload when it sends them (orchestrator/contexts.py),
once for the messages it sends together, only of the job's own tenant; outbox retention
keeps the event while they wait, and one whose event is gone fails with the reason."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
from sqlalchemy import text

from postrelay.core.errors import ValidationError
from postrelay.orchestrator import EMAIL_KIND, EmailJob, email_route, enqueue_email
from postrelay.orchestrator.contexts import EventContexts
from postrelay.queue import enqueue, ensure_tenant
from postrelay.relay import Relay, RouteRegistry, delete_handled_batch, emit
from postrelay.runtime import OUTBOX_READERS
from tests.orchestrator.conftest import write_template

TEAM = [f"member{n}@example.com" for n in range(3)]


def team_routes() -> RouteRegistry:
    routes = RouteRegistry()
    email_route("team.formed", template="team_note", to="team", split=True,
                sender="Acme <noreply@acme.example>", routes=routes)
    return routes


def form_team(engine, tenant, team: list[str], **extra) -> object:
    with engine.begin() as conn:
        return emit(conn, "team.formed", {"lead": "Ann", "team": team, **extra},
                    tenant_id=tenant, aggregate_type="team", aggregate_id="t1")


def email_job_ids(engine) -> list:
    with engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT id FROM mdm.aa_job WHERE job_kind = 'email_send'")).scalars())


def email_payloads(engine) -> list[dict]:
    with engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT payload FROM mdm.aa_job WHERE job_kind = 'email_send' "
            "ORDER BY idempotency_key")).scalars())


@pytest.fixture
def team_template(templates_dir):
    write_template(templates_dir, "team_note", "{{ lead }} formed a team of {{ team|length }}",
                   "Event {{ event.type }} for {{ lead }}.\n")


async def test_a_split_route_s_messages_render_their_event_s_payload(
        rig, tenant, sink, engine, async_engine, team_template):
    event_id = form_team(engine, tenant, TEAM)
    assert (await Relay(async_engine, team_routes()).run_once()).jobs == 3
    payloads = email_payloads(engine)
    assert [p["to"] for p in payloads] == [[a] for a in TEAM]
    for payload in payloads:  # no copy of the team in each job: the event is named
        assert payload["context_from_event"] is True and payload["context"] == {}
        assert payload["event_id"] == str(event_id)
    await rig.start()
    await rig.settle(*email_job_ids(engine))
    assert [row["status"] for row in rig.log()] == ["sent"] * 3
    subjects = sorted(m.message["subject"] for m in sink.handler.received)
    assert subjects == ["Ann formed a team of 3"] * 3
    assert all("Event team.formed for Ann." in m.message.get_content()
               for m in sink.handler.received)


async def test_an_event_listing_five_thousand_recipients_makes_small_jobs(
        engine, async_engine, tenant, clean_db):
    """Each job held a copy of the whole list: five thousand copies of 120 kB asked for
    600 MB, past the relay's 64 MiB per event, and the event failed."""
    team = [f"subscriber{n:05}@example.com" for n in range(5_000)]
    form_team(engine, tenant, team)
    result = await Relay(async_engine, team_routes()).run_once()
    assert (result.handled, result.jobs, result.failed) == (1, 5_000, 0)
    with engine.connect() as conn:
        stored = conn.execute(text(
            "SELECT sum(octet_length(CAST(payload AS text))) FROM mdm.aa_job "
            "WHERE job_kind = 'email_send'")).scalar_one()
    assert stored < 2_000_000  # about 300 bytes a job


async def test_the_messages_of_one_claim_read_their_events_once(
        engine, async_engine, tenant, clean_db):
    first, second = form_team(engine, tenant, TEAM), form_team(engine, tenant, TEAM[:1])
    contexts = EventContexts(async_engine.execution_options(isolation_level="AUTOCOMMIT"))
    contexts.prefetch([(tenant, first), (tenant, second), (tenant, first)])
    got = [await contexts.get(tenant, first), await contexts.get(tenant, second),
           await contexts.get(tenant, first)]
    assert contexts.reads == 1
    assert got[0] is not None and got[0]["team"] == TEAM and got[0]["event"]["id"] == str(first)
    assert got[1] is not None and got[1]["team"] == TEAM[:1]
    assert await contexts.get(tenant, first) == got[0] and contexts.reads == 1  # kept


async def test_another_tenant_s_event_is_no_context(engine, async_engine, tenant, clean_db):
    """A job names an event of its own tenant: another's reads as gone, never rendered."""
    event_id = form_team(engine, tenant, TEAM)
    with engine.begin() as conn:
        other = ensure_tenant(conn, "globex")
    contexts = EventContexts(async_engine.execution_options(isolation_level="AUTOCOMMIT"))
    assert await contexts.get(other, event_id) is None
    assert await contexts.get(tenant, event_id) is not None


async def test_a_message_whose_event_is_gone_fails_with_the_reason(
        rig, tenant, sink, engine, async_engine, team_template):
    event_id = form_team(engine, tenant, TEAM[:2])
    await Relay(async_engine, team_routes()).run_once()
    with engine.begin() as conn:  # as retention would, had the jobs not been waiting
        conn.execute(text("DELETE FROM mdm.aa_outbox_delivery WHERE event_id = :e"),
                     {"e": event_id})
        conn.execute(text("DELETE FROM mdm.aa_outbox_event WHERE id = :e"), {"e": event_id})
    job_ids = email_job_ids(engine)
    await rig.start()
    await rig.settle(*job_ids)
    assert sink.handler.received == []
    for job_id in job_ids:
        assert rig.job(job_id)["status"] == "dlq"
        (row,) = rig.log(job_id)
        assert row["status"] == "failed"
        assert f"the event {event_id}, whose payload is this message's context, is gone " \
               "(outbox retention)" in row["error"]


async def test_a_job_naming_another_tenant_s_event_sends_nothing(
        rig, tenant, sink, engine, team_template):
    event_id = form_team(engine, tenant, TEAM)
    with engine.begin() as conn:
        other = ensure_tenant(conn, "globex")
        payload = EmailJob(template="team_note", to=("zed@example.com",), event_id=event_id,
                           sender="noreply@acme.example", context_from_event=True).to_payload()
        job_id = enqueue(conn, EMAIL_KIND, payload, tenant_id=other, max_attempts=1)
    await rig.start()
    await rig.settle(job_id)
    assert sink.handler.received == []
    assert "is gone (outbox retention)" in rig.log(job_id)[0]["error"]


async def test_retention_keeps_an_event_while_its_messages_wait(
        engine, async_engine, tenant, clean_db):
    event_id = form_team(engine, tenant, TEAM)
    await Relay(async_engine, team_routes()).run_once()
    later = datetime.now(UTC) + timedelta(days=1)
    clean = partial(delete_handled_batch, readers=OUTBOX_READERS)  # as the worker's retention
    assert await clean(async_engine, later, 100) == 0  # three messages pending
    assert await delete_handled_batch(async_engine, later, 100) == 1  # the relay's alone
    event_id = form_team(engine, tenant, TEAM)
    await Relay(async_engine, team_routes()).run_once()
    with engine.begin() as conn:
        conn.execute(text("UPDATE mdm.aa_job SET status = 'done', completed_at = now() "
                          "WHERE job_kind = 'email_send'"))
    assert await clean(async_engine, later, 100) == 1
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_outbox_event WHERE id = :e"),
                            {"e": event_id}).scalar_one() == 0


def test_a_payload_that_shares_its_event_s_context_must_name_the_event():
    shaped = {"template": "welcome", "to": ["ann@example.com"], "context_from_event": True}
    with pytest.raises(ValidationError) as refused:
        EmailJob.from_payload(shaped)
    assert refused.value.field == "event_id"
    with pytest.raises(ValidationError) as refused:
        EmailJob.from_payload({**shaped, "context_from_event": "yes"})
    assert refused.value.field == "context_from_event"


def test_enqueue_email_refuses_a_shared_context_without_its_event(engine, tenant, clean_db):
    with engine.begin() as conn, pytest.raises(ValidationError) as refused:
        enqueue_email(conn, EmailJob(template="welcome", to=("ann@example.com",),
                                     context_from_event=True), tenant_id=tenant)
    assert refused.value.field == "event_id"
