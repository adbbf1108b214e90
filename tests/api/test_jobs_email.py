"""An `email_send` job enqueued over HTTP by the service-role key: its payload is checked at
enqueue as `enqueue_email` checks a message, so a bad one is a 400 naming its field with
nothing written, not a 201 for a job that fails at its first run."""

from __future__ import annotations

import pytest

from postrelay.core.errors import ValidationError
from postrelay.orchestrator import EmailJob, enqueue_email
from tests.api.conftest import data, error
from tests.factories import scalar

JOBS = "/v1/functions/jobs"
GOOD = {"template": "welcome", "to": ["Ann <ann@x.example>"]}


def email_jobs(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM mdm.aa_job WHERE job_kind::text = 'email_send'")


# (the payload's change, the field the answer names): each a payload the handler refuses.
BAD = [
    ({"to": ["Bob\u202e <bob@x.example>"]}, "payload.to[0]"),  # a bidi override in the name
    ({"to": ["a@x.example\r\nBcc: evil@x.example"]}, "payload.to[0]"),  # header injection
    ({"to": ["ann@x.example", "Bob, Smith <b@x.example>"]}, "payload.to[1]"),  # unquoted ','
    ({"to": ["not an address"]}, "payload.to[0]"),
    ({"to": []}, "payload.to"),
    ({"to": [7]}, "payload.to"),
    ({"cc": ["a@x.example\nb"]}, "payload.cc[0]"),
    ({"bcc": ["nobody"]}, "payload.bcc[0]"),
    ({"reply_to": ["Eve\u2066 <eve@x.example>"]}, "payload.reply_to[0]"),
    ({"from": "Acme\u202e <noreply@x.example>"}, "payload.from[0]"),
    ({"from": 5}, "payload.from"),
    ({"template": ""}, "payload.template"),
    ({"template": 3}, "payload.template"),
    ({"template": "../secrets"}, "payload.template"),  # names no template folder
    ({"context_from_event": True}, "payload.event_id"),  # names no event to read
    ({"context": [1, 2]}, "payload.context"),
    ({"category": "a\r\nb"}, "payload.category"),
    ({"category": "x" * 101}, "payload.category"),
    ({"event_id": "nope"}, "payload.event_id"),
    ({"unsubscribe": "yes"}, "payload.unsubscribe"),
    ({"unsubscribe": True, "cc": ["b@x.example"]}, "payload.to"),  # bulk: one recipient
]


@pytest.mark.parametrize(("change", "field"), BAD)
def test_a_bad_email_payload_is_400_naming_its_field(api, engine, tenant, change, field):
    body = {"kind": "email_send", "tenantId": str(tenant), "payload": GOOD | change}
    err = error(api.post(JOBS, json=body), 400)
    assert err["code"] == "invalid_request" and err["field"] == field
    assert err["message"].startswith(f"{field}: ")
    assert email_jobs(engine) == 0


@pytest.mark.parametrize(("change", "field"), [b for b in BAD if "[" in b[1]])
def test_the_rule_is_the_one_enqueue_email_states(api, engine, tenant, change, field):
    """The same code: an address `enqueue_email` refuses is refused in the same words."""
    payload = GOOD | change
    with engine.connect() as conn, pytest.raises(ValidationError) as refused:
        enqueue_email(conn, EmailJob.from_payload(payload), tenant_id=tenant)
    err = error(api.post(JOBS, json={"kind": "email_send", "tenantId": str(tenant),
                                     "payload": payload}), 400)
    assert err["message"] == f"payload.{refused.value.field}: {refused.value.rule}"


def test_a_good_email_payload_is_enqueued_as_written(api, engine, tenant):
    payload = GOOD | {"cc": "Bo <bo@x.example>", "context": {"name": "Ann"}, "category": "news",
                      "from": "Acme <noreply@x.example>", "reply_to": ["help@x.example"]}
    job = data(api.post(JOBS, json={"kind": "email_send", "tenantId": str(tenant),
                                    "payload": payload}), 201)
    assert job["kind"] == "email_send" and job["payload"] == payload
    assert email_jobs(engine) == 1


def test_other_kinds_keep_any_object_payload(api, engine, tenant):
    """Only `email_send` is read as a message: another kind may carry a `to` of its own."""
    job = data(api.post(JOBS, json={"kind": "reindex", "tenantId": str(tenant),
                                    "payload": {"to": ["not an address"]}}), 201)
    assert job["payload"] == {"to": ["not an address"]}


def test_a_tenant_key_is_refused_the_kind_before_its_payload_is_read(acme_client, engine):
    err = error(acme_client.post(JOBS, json={"kind": "email_send",
                                             "payload": {"to": ["not an address"]}}), 403)
    assert err["code"] == "kind_reserved"
    assert email_jobs(engine) == 0
