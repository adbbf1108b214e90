"""Amazon SES notifications through SNS over real HTTP: signature verification
(SignatureVersion 1 and 2) with a pinned certificate, and Bounce / Complaint / Delivery
notifications as the SES documentation shows them (a certificate fetched from an allowed
host, and the subscription handshake: test_webhook_ses_fetched.py). No network: the test
makes its own CA and certificates.
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import trustme
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding

from tests.api.server import UNTHROTTLED, serve_database
from tests.feedback.conftest import insert_log

URL = "/v1/email/feedback/ses"
TOPIC = "arn:aws:sns:us-west-2:123456789012:ses-feedback"
SES_ID = "0000014644fe5ef6-9a483358-9170-4cb4-a269-f5dcdf415321-000000"
ANN, BOB = "ann@example.com", "bob@example.com"

CA = trustme.CA(key_type=trustme.KeyType.RSA)
SIGNER = CA.issue_cert("sns.amazonaws.com", key_type=trustme.KeyType.RSA)
SIGNER_KEY = serialization.load_pem_private_key(SIGNER.private_key_pem.bytes(), None)
OTHER = trustme.CA(key_type=trustme.KeyType.RSA).issue_cert(
    "sns.amazonaws.com", key_type=trustme.KeyType.RSA)
OTHER_KEY = serialization.load_pem_private_key(OTHER.private_key_pem.bytes(), None)
SIGNED = {"Notification": ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
          "SubscriptionConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp",
                                       "Token", "TopicArn", "Type")}


def sns_time(offset: float = 0) -> str:
    """A Timestamp `offset` seconds from now, as SNS writes it."""
    moment = datetime.now(UTC) + timedelta(seconds=offset)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def sns(kind: str, message: str, *, cert_url: str, version: str = "1", key: Any = SIGNER_KEY,
        topic: str = TOPIC, **extra: str) -> dict[str, str]:
    """An SNS message to an HTTP endpoint, signed as SNS signs it."""
    found = {"Type": kind, "MessageId": str(uuid.uuid4()), "TopicArn": topic,
             "Message": message, "Timestamp": sns_time(),
             "SignatureVersion": version, "SigningCertURL": cert_url, **extra}
    text = "".join(f"{name}\n{found[name]}\n" for name in SIGNED[kind] if name in found)
    digest = hashes.SHA1() if version == "1" else hashes.SHA256()
    found["Signature"] = base64.b64encode(
        key.sign(text.encode(), padding.PKCS1v15(), digest)).decode()
    return found


def post(client: httpx.Client, message: dict[str, str]) -> httpx.Response:
    # SNS posts JSON as text/plain.
    return client.post(URL, content=json.dumps(message).encode(),
                       headers={"Content-Type": "text/plain; charset=UTF-8",
                                "x-amz-sns-message-type": message["Type"]})


def mail(message_id: str) -> dict[str, Any]:
    return {"timestamp": "2016-01-27T14:59:38.237Z", "messageId": SES_ID,
            "source": "noreply@acme.example", "sourceIp": "127.0.3.0",
            "sendingAccountId": "123456789012", "destination": [ANN, BOB],
            "headersTruncated": False,
            "headers": [{"name": "From", "value": "noreply@acme.example"},
                        {"name": "To", "value": f"{ANN}, {BOB}"},
                        {"name": "Message-ID", "value": message_id},
                        {"name": "Subject", "value": "Hello"}],
            "commonHeaders": {"from": ["noreply@acme.example"], "to": [ANN, BOB],
                              "messageId": message_id, "subject": "Hello"}}


def bounce_note(message_id: str, **bounce: Any) -> str:
    return json.dumps({"notificationType": "Bounce", "mail": mail(message_id), "bounce": {
        "bounceType": "Permanent", "bounceSubType": "General",
        "bouncedRecipients": [{"emailAddress": ANN, "action": "failed", "status": "5.1.1",
                               "diagnosticCode": "smtp; 550 5.1.1 user unknown"}],
        "timestamp": "2016-01-27T14:59:38.237Z",
        "feedbackId": "00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa0680-000000",
        "remoteMtaIp": "127.0.2.0", "reportingMTA": "dsn; a8-70.smtp-out.amazonses.com",
        **bounce}})


# --- the pinned certificate ----------------------------------------------------------------

@pytest.fixture(scope="module")
def pinned(database_url, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sns")
    cert = folder / "sns-signing.pem"
    cert.write_bytes(SIGNER.cert_chain_pems[0].bytes())
    with serve_database(database_url, "svc-key-for-the-ses-webhook-tests-000001",
                        feedback_ses_topic_arns=f"{TOPIC}, arn:aws:sns:eu-west-1:1:other",
                        feedback_ses_cert_file=str(cert), **UNTHROTTLED) as url:
        yield url


@pytest.fixture
def client(pinned, clean_db):
    with httpx.Client(base_url=pinned, timeout=30) as c:
        yield c


# The certificate is pinned: the URL is never fetched (nothing listens there).
NOWHERE = "https://sns.us-west-2.amazonaws.com/SimpleNotificationService-0000.pem"


@pytest.mark.parametrize("version", ["1", "2"])
def test_a_bounce_notification_is_verified_matched_and_recorded_once(client, engine, tenant,
                                                                     look, version):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=(ANN, BOB))
    message = sns("Notification", bounce_note(sent["message_id"]), cert_url=NOWHERE,
                  version=version, Subject="Amazon SES Email Event Notification")
    for _ in range(2):  # SNS retries a delivery it thinks failed: same MessageId
        answer = post(client, message)
        assert answer.status_code == 200, answer.text
    assert answer.json()["data"] == {"recorded": 0, "duplicates": 1, "matched": 1,
                                     "ignored": 0}
    (row,) = look.feedback()
    assert (row["tenant_id"], row["email_log_id"], row["matched_by"], row["recipient"],
            row["kind"], row["status"], row["source"], row["source_event_id"]) == (
        tenant, sent["id"], "message_id", ANN, "bounced", "5.1.1", "ses",
        "00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa0680-000000")
    assert set(look.suppressed(tenant)) == {(ANN, "")}
    assert [e["event_type"] for e in look.events()] == ["email.bounced"]


def test_complaint_and_delivery_matched_by_the_ses_message_id(client, engine, tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=(ANN, BOB), queue_id=SES_ID)
    stranger = "<not-ours@elsewhere.example>"
    complaint = json.dumps({"notificationType": "Complaint", "mail": mail(stranger),
                            "complaint": {"userAgent": "AnyCompany Feedback Loop (V0.01)",
                                          "complainedRecipients": [{"emailAddress": BOB}],
                                          "complaintFeedbackType": "abuse",
                                          "arrivalDate": "2016-01-27T14:59:38.237Z",
                                          "timestamp": "2016-01-27T14:59:38.237Z",
                                          "feedbackId": "complaint-feedback-1"}})
    delivery = json.dumps({"notificationType": "Delivery", "mail": mail(stranger),
                           "delivery": {"timestamp": "2016-01-27T14:59:38.237Z",
                                        "processingTimeMillis": 546, "recipients": [ANN],
                                        "smtpResponse": "250 ok:  Message 64111812 accepted",
                                        "remoteMtaIp": "127.0.2.0",
                                        "reportingMTA": "a8-70.smtp-out.amazonses.com"}})
    for note in (complaint, delivery):
        answer = post(client, sns("Notification", note, cert_url=NOWHERE, version="2"))
        assert answer.status_code == 200, answer.text
    rows = {r["kind"]: r for r in look.feedback()}
    assert {k: (r["recipient"], r["matched_by"], r["email_log_id"])
            for k, r in rows.items()} == {"complaint": (BOB, "queue_id", sent["id"]),
                                          "delivered": (ANN, "queue_id", sent["id"])}
    assert set(look.suppressed(tenant)) == {(BOB, "")}


def test_transient_and_content_bounces_do_not_suppress(client, engine, tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=(ANN, BOB))
    full = bounce_note(sent["message_id"], bounceType="Transient", bounceSubType="MailboxFull",
                       feedbackId="t-1", bouncedRecipients=[{"emailAddress": ANN}])
    big = bounce_note(sent["message_id"], bounceSubType="MessageTooLarge", feedbackId="p-1",
                      bouncedRecipients=[{"emailAddress": BOB}])
    for note in (full, big):
        assert post(client, sns("Notification", note, cert_url=NOWHERE)).status_code == 200
    assert {(r["recipient"], r["kind"], r["status"]) for r in look.feedback()} == {
        (ANN, "soft-bounced", None), (BOB, "bounced", "5.3.4")}
    assert look.suppressed(tenant) == {}


def test_a_permanent_bounce_with_only_the_class_code_is_hard(client, engine, tenant, look):
    """The SES guide's own bounce example gives `"status": "5.0.0"` beside "550 user unknown"
    for a Permanent/General bounce, which it says to remove from the list; Exim's DSNs
    relayed by SES give 5.0.0 beside the remote's 5.1.1."""
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=(ANN, BOB))
    note = bounce_note(sent["message_id"], bouncedRecipients=[
        {"emailAddress": ANN, "action": "failed", "status": "5.0.0",
         "diagnosticCode": "smtp; 550 user unknown"},
        {"emailAddress": BOB, "action": "failed", "status": "5.0.0",
         "diagnosticCode": "smtp; 550 5.1.1 <bob@example.com>: Recipient address rejected: "
                           "User unknown"}])
    assert post(client, sns("Notification", note, cert_url=NOWHERE)).status_code == 200
    rows = {r["recipient"]: (r["kind"], r["status"], r["detail"]["status"])
            for r in look.feedback()}
    assert rows == {ANN: ("bounced", None, "5.0.0"), BOB: ("bounced", "5.1.1", "5.0.0")}
    assert set(look.suppressed(tenant)) == {(ANN, ""), (BOB, "")}


def test_bounces_about_the_message_never_count_against_the_address(client, engine, tenant,
                                                                   look):
    """SES's guide lists MessageTooLarge, ContentRejected and AttachmentRejected as
    Transient subtypes. Counted as soft bounces, three of them suppressed the address."""
    for i, (subtype, diagnostic) in enumerate((
            ("MessageTooLarge", "smtp; 552 5.3.4 Message size exceeds fixed limit"),
            ("ContentRejected", "smtp; 554 5.6.0 Message content rejected"),
            ("AttachmentRejected", "smtp; 554 Attachment type not allowed"))):
        with engine.begin() as conn:
            sent = insert_log(conn, tenant_id=tenant, recipients=(ANN,))
        note = bounce_note(sent["message_id"], bounceType="Transient", bounceSubType=subtype,
                           feedbackId=f"t-{i}", bouncedRecipients=[
                               {"emailAddress": ANN, "action": "failed",
                                "diagnosticCode": diagnostic}])
        assert post(client, sns("Notification", note, cert_url=NOWHERE)).status_code == 200
    assert sorted((r["kind"], r["status"]) for r in look.feedback()) == [
        ("bounced", "5.3.4"), ("bounced", "5.6.0"), ("bounced", "5.6.0")]
    assert look.suppressed(tenant) == {}


@pytest.mark.parametrize("feedback_type", ["not-spam", "auth-failure"])
def test_a_report_that_the_mail_is_not_spam_is_no_complaint(client, engine, tenant, look,
                                                            feedback_type):
    """SES: "not-spam — Indicates that the entity providing the report does not consider
    the message to be spam." As for an ARF report by mail, it is kept for an operator."""
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=(ANN,))
    note = json.dumps({"notificationType": "Complaint", "mail": mail(sent["message_id"]),
                       "complaint": {"complainedRecipients": [{"emailAddress": ANN}],
                                     "complaintFeedbackType": feedback_type,
                                     "timestamp": "2016-01-27T14:59:38.237Z",
                                     "feedbackId": "complaint-feedback-2"}})
    assert post(client, sns("Notification", note, cert_url=NOWHERE)).status_code == 200
    (row,) = look.feedback()
    assert (row["kind"], row["detail"]["feedback_type"]) == ("unparsed", feedback_type)
    assert look.suppressed(tenant) == {} and look.events() == []
    assert look.log(sent["id"])["delivery"] is None


def test_a_complaint_notice_for_mail_never_sent_is_no_new_complaint(client, engine, tenant,
                                                                    look):
    """SES: with complaintSubType OnAccountSuppressionList, "Amazon SES accepted the
    message, but didn't attempt to send it because it was on the account-level suppression
    list". Recorded as a complaint, mail nobody received raised the complaint rate."""
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=(ANN,))
    note = json.dumps({"notificationType": "Complaint", "mail": mail(sent["message_id"]),
                       "complaint": {"complainedRecipients": [{"emailAddress": ANN}],
                                     "complaintSubType": "OnAccountSuppressionList",
                                     "timestamp": "2016-01-27T14:59:38.237Z",
                                     "feedbackId": "complaint-feedback-3"}})
    assert post(client, sns("Notification", note, cert_url=NOWHERE)).status_code == 200
    (row,) = look.feedback()
    assert (row["kind"], row["suppressed"], row["detail"]["sub_type"]) == (
        "bounced", True, "OnAccountSuppressionList")
    assert look.log(sent["id"])["delivery"] == "bounced"
    assert [e["event_type"] for e in look.events()] == ["email.bounced"]


def test_forged_or_foreign_messages_are_401_and_write_nothing(client, engine, tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    note = bounce_note(sent["message_id"])
    good = sns("Notification", note, cert_url=NOWHERE)
    attempts = [
        sns("Notification", note, cert_url=NOWHERE, key=OTHER_KEY),  # another signer
        {**good, "Message": note.replace("5.1.1", "5.1.2")},  # changed after signing
        {**good, "SignatureVersion": "3"},
        {**good, "Signature": "not base64!"},
        # Signed by SNS's key, but from somebody else's topic.
        sns("Notification", note, cert_url=NOWHERE, topic="arn:aws:sns:us-west-2:666:evil"),
    ]
    for message in attempts:
        answer = post(client, message)
        assert answer.status_code == 401, answer.text
    assert look.feedback() == [] and look.suppressed(tenant) == {} and look.events() == []


@pytest.mark.parametrize(("change", "field"), [
    ({"Type": "Gossip"}, "Type"),
    ({"Message": "{not json"}, "Message"),
    ({"Message": json.dumps({"notificationType": "Bounce", "mail": {"messageId": SES_ID},
                             "bounce": {"bounceType": "Permanent", "feedbackId": "f",
                                        "bouncedRecipients": [{"status": "5.1.1"}]}})},
     "Message.bounce.bouncedRecipients[0].emailAddress"),
    ({"Message": json.dumps({"notificationType": "Bounce", "bounce": {}})}, "Message.mail"),
    ({"Message": json.dumps({"mail": {"messageId": SES_ID}})},
     "Message.notificationType"),
])
def test_a_malformed_notification_is_400_naming_the_field(client, tenant, look, change, field):
    fields = {"Message": bounce_note("<x@y.example>"), **change}
    kind = fields.pop("Type", "Notification")
    if kind in SIGNED:
        message = sns(kind, fields.pop("Message"), cert_url=NOWHERE)
    else:
        message = {**sns("Notification", fields.pop("Message"), cert_url=NOWHERE),
                   "Type": kind}
    answer = post(client, message)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == field
    assert look.feedback() == []


def test_a_raw_delivered_notification_is_refused_naming_the_sns_envelope(client, tenant,
                                                                         look):
    """A subscription with raw message delivery on posts SES's JSON alone: no SNS
    signature to check, so nothing is written, and the answer names what is missing."""
    answer = client.post(URL, content=bounce_note("<x@y.example>").encode(), headers={
        "Content-Type": "text/plain; charset=UTF-8", "x-amz-sns-message-type": "Notification",
        "x-amz-sns-rawdelivery": "true"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == "Type"
    assert look.feedback() == [] and look.suppressed(tenant) == {}


def test_ignored_event_types_are_acknowledged_and_not_recorded(client, look):
    note = json.dumps({"eventType": "Open", "mail": mail("<a@b.example>"), "open": {}})
    answer = post(client, sns("Notification", note, cert_url=NOWHERE))
    assert answer.json()["data"]["ignored"] == 1 and look.feedback() == []


def test_without_topics_the_webhook_is_404(database_url, clean_db):
    with serve_database(database_url, "svc-key-for-the-ses-webhook-tests-000002") as url:
        answer = httpx.post(f"{url}{URL}", json={"Type": "Notification"}, timeout=30)
    assert answer.status_code == 404
    assert "POSTRELAY_FEEDBACK_SES_TOPIC_ARNS" in answer.json()["error"]["message"]
