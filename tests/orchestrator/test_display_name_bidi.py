"""Display names may not carry the bidirectional controls that reorder what a mail client
shows (embeddings, overrides, isolates); the directional marks right-to-left names are
written with stay, and arrive intact through a real SMTP server."""

from __future__ import annotations

import email.policy
import unicodedata
from email import message_from_bytes
from email.headerregistry import Address
from typing import Any

import pytest
from sqlalchemy import text

from postrelay.core.errors import ConfigError, ValidationError
from postrelay.core.settings import Settings
from postrelay.orchestrator import EMAIL_KIND, EmailJob, email_route, enqueue_email
from postrelay.orchestrator.addresses import AddressError, check_header_value, parse_address
from postrelay.orchestrator.identity import check_identity_settings
from postrelay.queue import enqueue
from postrelay.relay import Relay, RouteRegistry, emit
from tests.orchestrator.test_message import build, rendered

REFUSED = [chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))]
MARKS = ["\u200e", "\u200f", "\u061c"]  # LRM, RLM, ALM
# Invisible, but they reorder nothing and spell words (ZWNJ, ZWJ): allowed.
OTHER_FORMAT = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"]
ARABIC = "\u0645\u062d\u0645\u062f \u0639\u0644\u064a\u200f"  # محمد علي + RLM
HEBREW = "\u05d3\u05d5\u05d3 \u05db\u05d4\u05df\u200f (\u05ea\u05de\u05d9\u05db\u05d4)\u200e"
SENDER = "Acme <noreply@acme.example>"


def _named(char: str) -> str:
    return f"U+{ord(char):04X} {unicodedata.name(char)}"


def _encoded(name: str) -> str:
    """`name` as one RFC 2047 Q encoded-word, as a mail client would write it."""
    return "=?utf-8?q?" + "".join(f"={b:02X}" for b in name.encode()) + "?="


@pytest.mark.parametrize("char", REFUSED, ids=[f"U+{ord(c):04X}" for c in REFUSED])
@pytest.mark.parametrize("spelling", ["unquoted", "quoted", "encoded-word"])
def test_each_bidi_control_in_a_display_name_is_refused_by_name(char: str,
                                                                spelling: str) -> None:
    name = f"Acme{char} Support"
    value = {"unquoted": f"{name} <help@acme.example>",
             "quoted": f'"{name}, EU" <help@acme.example>',
             "encoded-word": f"{_encoded(name)} <help@acme.example>"}[spelling]
    with pytest.raises(AddressError) as caught:
        parse_address(value, field="reply_to")
    assert caught.value.field == "reply_to"
    assert _named(char) in caught.value.rule
    assert "must not hold bidirectional embeddings, overrides or isolates" in caught.value.rule
    assert char not in str(caught.value)  # the error shows it escaped, never reordering


def test_every_control_found_is_named_in_one_error() -> None:
    value = "\"\u2067\u202eemoc.elpmaxe@nimda\u202c\u2069\" <x@evil.example>"
    with pytest.raises(AddressError) as caught:
        parse_address(value, field="from")
    rule = caught.value.rule
    assert all(_named(c) in rule for c in "\u2067\u202e\u202c\u2069")


@pytest.mark.parametrize("name", [ARABIC, HEBREW, *(f"Ann{c}Lee" for c in MARKS),
                                  *(f"Ann{c}Lee" for c in OTHER_FORMAT),
                                  "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"])
def test_directional_marks_and_other_format_characters_are_kept(name: str) -> None:
    address = parse_address(f'"{name}" <a@example.com>', field="to")
    assert address.display_name == name


@pytest.mark.parametrize("where", ["to", "sender"])
def test_hand_built_addresses_with_an_override_are_refused_by_build_message(where: str) -> None:
    address = Address(display_name="Bank\u202e", username="a", domain="example.com")
    with pytest.raises(ValidationError) as caught:
        build(**({"to": [address]} if where == "to" else {"sender": address}))
    assert caught.value.field == ("to[0]" if where == "to" else "from")
    assert _named("\u202e") in caught.value.rule


def test_subjects_are_not_display_names_and_keep_their_controls() -> None:
    subject = "Order \u2067\u0645\u062d\u0645\u062f\u2069 shipped"
    assert check_header_value(subject, field="subject") == subject
    message = build(rendered=rendered(subject=subject))
    parsed = message_from_bytes(message.as_bytes(), policy=email.policy.default)
    assert parsed["Subject"] == subject


def test_a_route_with_such_a_sender_is_refused_when_registered() -> None:
    with pytest.raises(ValidationError) as caught:
        email_route("user.signed_up", template="welcome", to="user.email",
                    sender="Acme\u202d <noreply@acme.example>", routes=RouteRegistry())
    assert caught.value.field == "sender" and _named("\u202d") in caught.value.rule


def test_a_from_setting_with_an_isolate_stops_the_worker_at_start() -> None:
    settings = Settings(email_from="\u2066Acme <noreply@acme.example>")
    with pytest.raises(ConfigError, match="POSTRELAY_EMAIL_FROM: .*U\\+2066"):
        check_identity_settings(settings)


def test_enqueue_email_refuses_and_writes_nothing(engine, tenant) -> None:
    message = EmailJob(template="welcome", to=("ann@example.com",),
                       reply_to=("help@acme.example", "Help\u202b <help@acme.example>"))
    with engine.begin() as conn:
        with pytest.raises(ValidationError) as caught:
            enqueue_email(conn, message, tenant_id=tenant)
        assert caught.value.field == "reply_to[1]"
        assert _named("\u202b") in caught.value.rule
        # The transaction is still usable, and holds no job.
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job")).scalar() == 0


async def test_rlm_and_lrm_names_are_sent_and_arrive_intact(rig, tenant, sink) -> None:
    job_id = rig.enqueue(tenant, sender=f'"{ARABIC}" <shop@acme.example>',
                         to=[f'"{HEBREW}" <dan@example.com>'],
                         reply_to=("Ann\u200eLee <ann@acme.example>",))
    await rig.start()
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "done"
    [received] = sink.handler.received
    parsed = message_from_bytes(received.raw, policy=email.policy.default)
    assert parsed["From"].addresses[0].display_name == ARABIC
    assert parsed["To"].addresses[0].display_name == HEBREW
    assert parsed["Reply-To"].addresses[0].display_name == "Ann\u200eLee"


async def test_a_job_enqueued_before_the_rule_fails_permanently_with_the_reason(
        rig, tenant, sink) -> None:
    """Its payload went in unchecked (as every job written before the rule did): the run
    fails it once, logged `failed` naming the field and the control, and sends nothing;
    the worker goes on with the next job."""
    def raw(**fields: Any) -> dict[str, Any]:
        return EmailJob(template="welcome", context={"user": {"name": "Ann"}},
                        **fields).to_payload()

    old = [raw(to=("ann@example.com",), sender="PayPal\u202e <noreply@evil.example>"),
           raw(to=("\u2067Ann\u2069 <ann@example.com>",), sender=SENDER)]
    with rig.engine.begin() as conn:
        jobs = [enqueue(conn, EMAIL_KIND, payload, tenant_id=tenant, max_attempts=5)
                for payload in old]
    await rig.start()
    await rig.settle(*jobs)
    good = rig.enqueue(tenant)
    await rig.settle(good)

    for job_id, field, char in ((jobs[0], "from", "\u202e"), (jobs[1], "to[0]", "\u2067")):
        job = rig.job(job_id)
        assert job["status"] == "dlq" and job["attempts"] == 1  # no retries burnt
        assert _named(char) in job["last_error"]
        [row] = rig.log(job_id)
        assert row["status"] == "failed" and row["error"].startswith(f"{field}: ")
        assert _named(char) in row["error"]
    assert rig.job(good)["status"] == "done"
    assert [r.recipients for r in sink.handler.received] == [("ann@example.com",)]


async def test_a_route_recipient_from_the_event_fails_only_its_message(
        engine, async_engine, tenant, rig) -> None:
    routes = RouteRegistry()
    email_route("user.signed_up", template="welcome", to="user.email", sender=SENDER,
                routes=routes)
    payload = {"user": {"name": "Ann", "email": "Ann\u202e <ann@example.com>"}}
    with engine.begin() as conn:
        emit(conn, "user.signed_up", payload, tenant_id=tenant, aggregate_type="user",
             aggregate_id="ann")
    assert (await Relay(async_engine, routes).run_once()).handled == 1
    with engine.connect() as conn:
        job_id = conn.execute(text("SELECT id FROM mdm.aa_job WHERE job_kind = 'email_send'"
                                   )).scalar_one()
    await rig.start(kinds=["email_send"])
    await rig.settle(job_id)
    assert rig.job(job_id)["status"] == "dlq" and rig.job(job_id)["attempts"] == 1
    [row] = rig.log(job_id)
    assert row["status"] == "failed" and _named("\u202e") in row["error"]
    assert rig.sink.handler.received == []
