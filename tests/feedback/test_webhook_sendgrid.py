"""SendGrid's Event Webhook over real HTTP: ECDSA-signed batches as SendGrid's documentation
shows them, matched to the log by Message-ID and queue id, recorded once."""

from __future__ import annotations

import base64
import json
import time
import uuid

import httpx
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.api.server import UNTHROTTLED, serve_database
from tests.feedback.conftest import insert_log

URL = "/v1/email/feedback/sendgrid"
SIG = "X-Twilio-Email-Event-Webhook-Signature"
STAMP = "X-Twilio-Email-Event-Webhook-Timestamp"
KEY = ec.generate_private_key(ec.SECP256R1())
PUBLIC = base64.b64encode(KEY.public_key().public_bytes(
    serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).decode()
ANN, BOB = "ann@example.com", "bob@example.com"


def now(offset: float = 0) -> str:
    """A timestamp header `offset` seconds from now, as SendGrid writes it."""
    return str(int(time.time() + offset))


def signed(events: object, key: ec.EllipticCurvePrivateKey = KEY,
           stamp: str | None = None) -> dict[str, object]:
    body = json.dumps(events).encode()
    stamp = now() if stamp is None else stamp
    signature = key.sign(stamp.encode() + body, ec.ECDSA(hashes.SHA256()))
    return {"content": body, "headers": {"Content-Type": "application/json",
                                         SIG: base64.b64encode(signature).decode(),
                                         STAMP: stamp}}


@pytest.fixture(scope="module")
def served(database_url):
    with serve_database(database_url, "svc-key-for-the-sendgrid-webhook-tests-01",
                        feedback_sendgrid_public_key=PUBLIC, **UNTHROTTLED) as url:
        yield url


@pytest.fixture
def client(served, clean_db):
    with httpx.Client(base_url=served, timeout=30) as c:
        yield c


def doc_events(smtp_id: str, x_message_id: str) -> list[dict[str, object]]:
    """The events of SendGrid's Event Webhook reference, about our message."""
    sg_message_id = f"{x_message_id}.filterdrecv-p3mdw1-756b745b58-kmzbl-18-5F5FC76C-9.0"
    common = {"smtp-id": smtp_id, "sg_message_id": sg_message_id, "category": "cat facts",
              "timestamp": 1513299569}
    return [
        {**common, "email": ANN, "event": "processed", "sg_event_id": "rbtnWrG1DVDGGGFHFyun0A=="},
        {**common, "email": ANN, "event": "deferred", "response": "400 try again later",
         "attempt": "5", "sg_event_id": "t7LEShmowp86DTdUW8M-GQ=="},
        {**common, "email": ANN, "event": "delivered", "response": "250 OK",
         "sg_event_id": "rWVYmVk90MjZJ9iohOBa3w=="},
        {**common, "email": ANN, "event": "bounce", "type": "bounce",
         "reason": "550 5.1.1 The email account that you tried to reach does not exist",
         "status": "5.1.1", "bounce_classification": "Invalid Address",
         "sg_event_id": "6g4ZI7SA-xmRDv57GoPIPw=="},
        {**common, "email": BOB, "event": "spamreport", "sg_event_id": "37nvH5QBz858KGVYCM4uOA=="},
        {**common, "email": BOB, "event": "open", "useragent": "Mozilla/4.0",
         "ip": "255.255.255.255", "sg_event_id": "FOTFFO0ecsBE-zxFXfs6WA=="},
    ]


def test_a_signed_batch_is_matched_recorded_and_retried_without_effect(client, engine,
                                                                       tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=(ANN, BOB),
                          queue_id="14c5d75ce93.dfd.64b469")
    events = doc_events(sent["message_id"], "14c5d75ce93.dfd.64b469")
    answer = client.post(URL, **signed(events))
    assert answer.status_code == 200, answer.text
    # processed and open are engagement, not feedback
    assert answer.json()["data"] == {"recorded": 4, "duplicates": 0, "matched": 4,
                                     "ignored": 2}
    rows = {(r["recipient"], r["kind"]): r for r in look.feedback()}
    assert set(rows) == {(ANN, "delayed"), (ANN, "delivered"), (ANN, "bounced"),
                         (BOB, "complaint")}
    bounced = rows[(ANN, "bounced")]
    assert (bounced["tenant_id"], bounced["email_log_id"], bounced["status"],
            bounced["source"], bounced["source_event_id"], bounced["suppressed"]) == (
        tenant, sent["id"], "5.1.1", "sendgrid", "6g4ZI7SA-xmRDv57GoPIPw==", True)
    assert set(look.suppressed(tenant)) == {(ANN, ""), (BOB, "")}
    assert look.log(sent["id"])["delivery"] == "complained"
    assert sorted(e["event_type"] for e in look.events()) == [
        "email.bounced", "email.complained", "email.delivered"]
    before = (look.feedback(), look.events())
    again = client.post(URL, **signed(events, stamp=now(60)))  # SendGrid's retry
    assert again.json()["data"] == {"recorded": 0, "duplicates": 4, "matched": 4,
                                    "ignored": 2}
    assert (look.feedback(), look.events()) == before


def test_matched_by_the_queue_id_alone(client, engine, tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, queue_id="XMQC5kDvS1W-bLcSfxz0YQ")
    events = [{"email": ANN, "event": "bounce", "timestamp": 1700000000,
               "sg_event_id": "b-1", "status": "5.0.0", "reason": "550 5.1.1 unknown user",
               "sg_message_id": "XMQC5kDvS1W-bLcSfxz0YQ.filterdrecv-5645d9c87f-6r2ch-1-0"}]
    assert client.post(URL, **signed(events)).status_code == 200
    (row,) = look.feedback()
    assert (row["email_log_id"], row["matched_by"], row["kind"]) == (
        sent["id"], "queue_id", "bounced")


def test_a_spam_report_with_sendgrids_current_message_id_is_matched(client, engine, tenant,
                                                                    look):
    """A spam report carries no smtp-id: sg_message_id is its only key, which SendGrid now
    writes with `.recvd-…` after the X-Message-Id. Cut only at `.filter`, it matched
    nothing, and the complaint suppressed nobody."""
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, queue_id="XMQC5kDvS1W-bLcSfxz0YQ")
    events = [{"email": ANN, "event": "spamreport", "timestamp": 1700000000,
               "sg_event_id": "sr-1",
               "sg_message_id": "XMQC5kDvS1W-bLcSfxz0YQ.recvd-5b8bbd7c8b-2s8vp-1-6396B6D9-1D.0"}]
    assert client.post(URL, **signed(events)).status_code == 200
    (row,) = look.feedback()
    assert (row["email_log_id"], row["matched_by"], row["kind"]) == (
        sent["id"], "queue_id", "complaint")
    assert (ANN, "") in look.suppressed(tenant)

def test_a_block_and_a_drop_for_the_message_do_not_suppress(client, engine, tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    events = [{"email": ANN, "event": "bounce", "type": "blocked", "status": "5.0.0",
               "reason": "550 rejected for policy reasons", "sg_event_id": "blk-1",
               "smtp-id": sent["message_id"], "timestamp": 1700000000},
              {"email": ANN, "event": "dropped", "reason": "Recipient List over Package Quota",
               "sg_event_id": "drp-1", "smtp-id": sent["message_id"],
               "timestamp": 1700000000}]
    assert client.post(URL, **signed(events)).status_code == 200
    assert {(r["kind"], r["status"]) for r in look.feedback()} == {
        ("bounced", "5.7.0"), ("bounced", "5.0.0")}
    assert look.suppressed(tenant) == {}
    assert look.log(sent["id"])["delivery"] == "bounced"


def test_an_unsubscribe_of_a_group_suppresses_the_message_category_only(client, engine,
                                                                        tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, category="newsletter")
    events = [{"email": ANN, "event": "group_unsubscribe", "asm_group_id": 42,
               "sg_event_id": "u-1", "smtp-id": sent["message_id"], "timestamp": 1700000000}]
    assert client.post(URL, **signed(events)).status_code == 200
    assert set(look.suppressed(tenant)) == {(ANN, "newsletter")}
    assert [e["event_type"] for e in look.events()] == ["email.unsubscribed"]


def test_a_number_beyond_64_bits_in_an_event_is_kept_as_it_came(client, engine, tenant,
                                                                  look):
    """What an event carries into the report's detail is written as it came, a number
    orjson cannot write included: a batch that failed would come back again and again."""
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, category="newsletter")
    events = [{"email": ANN, "event": "group_unsubscribe", "asm_group_id": 2**70,
               "sg_event_id": "u-1", "smtp-id": sent["message_id"], "timestamp": 1700000000}]
    answer = client.post(URL, **signed(events))
    assert answer.status_code == 200, answer.text
    (row,) = look.feedback()
    assert row["detail"]["asm_group_id"] == 2**70


def test_feedback_about_no_message_of_ours_is_kept_unmatched_and_suppresses_nothing(
        client, tenant, look):
    events = [{"email": ANN, "event": "bounce", "status": "5.1.1", "sg_event_id": "f-1",
               "smtp-id": "<never-sent@elsewhere.example>", "timestamp": 1700000000}]
    assert client.post(URL, **signed(events)).json()["data"]["matched"] == 0
    (row,) = look.feedback()
    assert (row["tenant_id"], row["email_log_id"], row["suppressed"]) == (None, None, False)
    assert look.suppressed(tenant) == {} and look.events() == []



def test_feedback_about_a_deleted_tenants_mail_is_kept_and_the_batch_recorded(
        client, engine, tenant, gone_tenant, look):
    """One event about the mail of a tenant deleted since must not fail the batch: SendGrid
    would send it again and again, and the other events would never be recorded."""
    with engine.begin() as conn:
        ours, gone = (insert_log(conn, tenant_id=t) for t in (tenant, gone_tenant))
    events = [{"email": ANN, "event": "bounce", "status": "5.1.1", "sg_event_id": f"b-{i}",
               "smtp-id": sent["message_id"], "timestamp": 1700000000}
              for i, sent in enumerate((ours, gone))]
    answer = client.post(URL, **signed(events))
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"] == {"recorded": 2, "duplicates": 0, "matched": 1,
                                     "ignored": 0}
    rows = {r["source_event_id"]: r for r in look.feedback()}
    assert (rows["b-0"]["email_log_id"], rows["b-0"]["suppressed"]) == (ours["id"], True)
    assert (rows["b-1"]["tenant_id"], rows["b-1"]["email_log_id"]) == (None, None)
    assert rows["b-1"]["detail"]["tenant_gone"] == str(gone_tenant)
    assert rows["b-1"]["detail"]["claimed_log_id"] == str(gone["id"])
    assert set(look.suppressed(tenant)) == {(ANN, "")}
    assert look.rows("SELECT count(*) AS n FROM mdm.aa_email_suppression") == [{"n": 1}]
    assert [e["event_type"] for e in look.events()] == ["email.bounced"]

def test_an_address_too_long_to_be_one_does_not_fail_the_batch(client, engine, tenant,
                                                               look):
    """An event naming an 'address' longer than an index entry failed its whole batch
    (500), which SendGrid would send again and again."""
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    long = "".join(uuid.uuid4().hex for _ in range(100)) + "@example.com"
    events = [{"email": email, "event": "bounce", "status": "5.1.1", "sg_event_id": f"b-{i}",
               "smtp-id": smtp_id, "timestamp": 1700000000}
              for i, (email, smtp_id) in enumerate(((long, "<never-sent@elsewhere.example>"),
                                                    (ANN, sent["message_id"])))]
    answer = client.post(URL, **signed(events))
    assert answer.status_code == 200, answer.text
    rows = {r["source_event_id"]: r for r in look.feedback()}
    assert (rows["b-0"]["recipient"], rows["b-0"]["email_log_id"]) == (None, None)
    assert rows["b-0"]["detail"]["recipient_too_long"] == long[:254] + "…"
    assert (rows["b-1"]["email_log_id"], rows["b-1"]["suppressed"]) == (sent["id"], True)


def test_an_event_without_an_id_is_recorded_with_its_batch_once(client, engine, tenant,
                                                                 look):
    """SendGrid's legacy Marketing Email unsubscribes come without sg_event_id (its
    reference's example, verbatim below): such an event made the batch 400, which SendGrid
    retries for a day and then drops, the batch's other events with it."""
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    legacy = {"email": "nick@sendgrid.com", "timestamp": 1380822437,
              "newsletter": {"newsletter_user_list_id": "10557865",
                             "newsletter_id": "1943530", "newsletter_send_id": "2308608"},
              "category": ["Tests", "Newsletter"], "event": "unsubscribe"}
    events = [{"email": ANN, "event": "bounce", "status": "5.1.1", "sg_event_id": "b-1",
               "smtp-id": sent["message_id"], "timestamp": 1700000000}, legacy]
    for expected in ({"recorded": 2, "duplicates": 0}, {"recorded": 0, "duplicates": 2}):
        answer = client.post(URL, **signed(events))  # the second time: SendGrid's retry
        assert answer.status_code == 200, answer.text
        assert {k: answer.json()["data"][k] for k in expected} == expected
    kinds = {r["recipient"]: r["kind"] for r in look.feedback()}
    assert kinds == {ANN: "bounced", "nick@sendgrid.com": "unsubscribe"}
    assert set(look.suppressed(tenant)) == {(ANN, "")}


def test_a_bounce_without_a_specific_code_is_hard_unless_classified_otherwise(
        client, engine, tenant, look):
    """type=bounce is SendGrid's hard bounce; its reference's example gives only 5.0.0 and
    no classification. A classification other than Invalid Address (Technical, Content,
    Reputation, ...) is about the message or the sender."""
    with engine.begin() as conn:
        ann, bob = (insert_log(conn, tenant_id=tenant, recipients=(r,)) for r in (ANN, BOB))
    example = {"event": "bounce", "type": "bounce", "reason": "500 unknown recipient",
               "status": "5.0.0", "timestamp": 1513299569, "category": "cat facts"}
    events = [{**example, "email": ANN, "smtp-id": ann["message_id"], "sg_event_id": "b-1"},
              {**example, "email": BOB, "smtp-id": bob["message_id"], "sg_event_id": "b-2",
               "bounce_classification": "Content"}]
    assert client.post(URL, **signed(events)).status_code == 200
    rows = {r["recipient"]: (r["kind"], r["status"], r["suppressed"]) for r in look.feedback()}
    assert rows == {ANN: ("bounced", None, True), BOB: ("bounced", "5.0.0", False)}
    assert set(look.suppressed(tenant)) == {(ANN, "")}


def test_a_wrong_signature_is_401_and_writes_nothing(client, engine, tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    events = [{"email": ANN, "event": "bounce", "status": "5.1.1", "sg_event_id": "x-1",
               "smtp-id": sent["message_id"], "timestamp": 1700000000}]
    good = signed(events)
    forged = signed(events, key=ec.generate_private_key(ec.SECP256R1()))
    tampered = {**good, "content": good["content"].replace(b"5.1.1", b"5.1.2")}
    restamped = {**good, "headers": {**good["headers"], STAMP: now(1)}}
    unsigned = {"content": good["content"], "headers": {"Content-Type": "application/json"}}
    for attempt in (forged, tampered, restamped, unsigned):
        answer = client.post(URL, **attempt)
        assert answer.status_code == 401, answer.text
        assert answer.json()["error"]["code"] == "unauthorized"
    assert look.feedback() == [] and look.suppressed(tenant) == {} and look.events() == []


@pytest.mark.parametrize(("events", "field"), [
    ({"event": "bounce"}, "body"),
    ([{"event": "bounce", "sg_event_id": "e"}], "[0].email"),
    ([{"event": "bounce", "email": ANN, "sg_event_id": "e"}, "nonsense"], "[1]"),
    ([{"event": "delivered", "email": ANN, "sg_event_id": 7}], "[0].sg_event_id"),
    ([{"event": "delivered", "email": ANN, "sg_event_id": "e", "timestamp": "noon"}],
     "[0].timestamp"),
    ([{"event": "delivered", "email": ANN, "sg_event_id": "e", "timestamp": 1e30}],
     "[0].timestamp"),
])
def test_a_malformed_batch_is_400_naming_the_field_and_nothing_is_half_written(
        client, tenant, look, events, field):
    # A good event first: the bad one after it must take it back with it.
    batch = events if isinstance(events, dict) else [
        {"email": ANN, "event": "delivered", "sg_event_id": "ok-1"}, *events]
    answer = client.post(URL, **signed(batch))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    expected = field if field == "body" else "[" + str(int(field[1]) + 1) + field[2:]
    assert error["field"] == expected, error
    assert look.feedback() == []


def test_not_valid_json_is_400(client, look):
    body, stamp = b"[{not json", now()
    signature = KEY.sign(stamp.encode() + body, ec.ECDSA(hashes.SHA256()))
    answer = client.post(URL, content=body, headers={
        SIG: base64.b64encode(signature).decode(), STAMP: stamp})
    assert answer.status_code == 400 and answer.json()["error"]["field"] == "body"


def deep_batch(category: bytes, n: int) -> dict[str, object]:
    """A good event, then one whose category is `category` (raw JSON), signed."""
    body = (b'[{"email": "ann@example.com", "event": "delivered", "sg_event_id": "ok-%d"}, '
            b'{"email": "ann@example.com", "event": "delivered", "sg_event_id": "deep-%d", '
            b'"category": %s}]' % (n, n, category))
    stamp = now()
    signature = KEY.sign(stamp.encode() + body, ec.ECDSA(hashes.SHA256()))
    return {"content": body, "headers": {SIG: base64.b64encode(signature).decode(),
                                         STAMP: stamp}}


@pytest.mark.parametrize("levels", [63, 985])
def test_a_batch_nested_deeper_than_64_levels_is_400_and_writes_nothing(client, look,
                                                                        levels):
    """A category nested some 980 levels deep decoded, and then exhausted the encoder's
    recursion when its report was written: a 500, which SendGrid retries. The batch and
    the event are two levels, so a category of 62 makes 64 and is taken."""
    answer = client.post(URL, **deep_batch(b"[" * 62 + b"]" * 62, 1))
    assert answer.status_code == 200 and answer.json()["data"]["recorded"] == 2, answer.text
    answer = client.post(URL, **deep_batch(b"[" * levels + b"]" * levels, 2))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == {
        "code": "invalid_request", "field": "body",
        "message": "body: must not nest objects and arrays more than 64 levels deep"}
    assert {f["source_event_id"] for f in look.feedback()} == {"ok-1", "deep-1"}

def test_without_a_public_key_the_webhook_is_404(database_url, clean_db):
    with serve_database(database_url, "svc-key-for-the-sendgrid-webhook-tests-02") as url:
        answer = httpx.post(f"{url}{URL}", **signed([]))
    assert answer.status_code == 404
    assert "POSTRELAY_FEEDBACK_SENDGRID_PUBLIC_KEY" in answer.json()["error"]["message"]


def test_a_batch_larger_than_a_payload_is_taken_up_to_the_webhook_limit(client, look):
    # SendGrid batches up to 768 KB: over POSTRELAY_MAX_PAYLOAD_BYTES (256 KiB) + 64 KiB.
    event = {"email": ANN, "event": "open", "sg_event_id": "o", "useragent": "x" * 300}
    big = [event] * 1800
    assert 600_000 < len(json.dumps(big)) < 1_000_000
    assert client.post(URL, **signed(big)).json()["data"]["ignored"] == 1800
    answer = client.post(URL, **signed(big * 2))
    assert answer.status_code == 413 and "webhook" in answer.json()["error"]["message"]
