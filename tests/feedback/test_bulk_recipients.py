"""Bulk mail (an unsubscribe link) goes to one recipient a message: the link names who
unsubscribes, and anyone else the message reached could follow it. `enqueue_email` refuses
more, a bulk template's job with more fails without sending, and a bulk route sends each
address its own message."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from postrelay.core.errors import ValidationError
from postrelay.orchestrator import EmailJob, UnsubscribeLinks, email_route, enqueue_email
from postrelay.relay import Relay, RouteRegistry, emit
from tests.feedback.conftest import SECRET
from tests.feedback.test_unsubscribe import route_jobs
from tests.orchestrator.conftest import SENDER, write_template

ANN, BOB = "ann@example.com", "bob@example.com"
LINKS = UnsubscribeLinks("https://mail.acme.example", SECRET)


def jobs(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM mdm.aa_job")).scalar_one()


@pytest.mark.parametrize("recipients", [{"to": (ANN, BOB)}, {"to": (ANN,), "cc": (BOB,)},
                                        {"to": (ANN,), "bcc": (BOB,)}])
def test_enqueue_refuses_bulk_mail_to_more_than_one_recipient(engine, tenant, recipients):
    before = jobs(engine)
    with pytest.raises(ValidationError, match="to: bulk mail .* one recipient a message, not 2"), \
            engine.begin() as conn:
        enqueue_email(conn, EmailJob(template="digest", unsubscribe=True, **recipients),
                      tenant_id=tenant)
    assert jobs(engine) == before  # nothing written
    with engine.begin() as conn:  # the same address twice is one recipient
        enqueue_email(conn, EmailJob(template="digest", to=(ANN,), bcc=("Ann@Example.com",),
                                     unsubscribe=True), tenant_id=tenant)


async def test_a_bulk_templates_job_to_two_recipients_fails_without_sending(
        rig, tenant, sink, templates_dir):
    write_template(templates_dir, "digest", "Your digest", "News.\n", toml="unsubscribe = true\n")
    job = rig.enqueue(tenant, to=[ANN, BOB], template="digest", category="newsletter")
    await rig.start(unsubscribe=LINKS)
    await rig.settle(job)
    assert sink.handler.received == []
    ((status, error),) = [(r["status"], r["error"]) for r in rig.log(job)]
    assert status == "failed" and "one recipient a message, not 2" in error
    assert rig.job(job)["status"] == "dlq"


async def test_a_bulk_route_sends_each_address_its_own_message_and_link(
        rig, tenant, sink, engine, async_engine):
    routes = RouteRegistry()
    email_route("post.published", template="welcome", to="readers", category="newsletter",
                unsubscribe=True, sender=SENDER, name="newsletter", routes=routes)
    with engine.begin() as conn:
        event_id = emit(conn, "post.published", {"readers": [ANN, BOB], "user": {"name": "A"}},
                        tenant_id=tenant, aggregate_type="post", aggregate_id="p-1")
    assert (await Relay(async_engine, routes).run_once()).jobs == 2
    made = route_jobs(engine, event_id)
    assert set(made) == {"newsletter:0", "newsletter:1"}
    await rig.start(unsubscribe=LINKS)
    await rig.settle(*made.values())
    received = {m.recipients[0]: m.message for m in sink.handler.received}
    assert set(received) == {ANN, BOB}
    for address, message in received.items():
        assert message["To"] == address
        token = LINKS.token(tenant, address, "newsletter")
        assert message["List-Unsubscribe"].strip() == f"<https://mail.acme.example/u/{token}>"


def test_a_bulk_route_refuses_cc_and_bcc():
    for field in ("cc", "bcc"):
        with pytest.raises(ValidationError, match=f"{field}: a bulk route"):
            email_route("x", template="t", to="a@example.com", unsubscribe=True,
                        routes=RouteRegistry(), **{field: "archive@example.com"})
