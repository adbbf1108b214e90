"""Postmark's webhooks over real HTTP: Bounce, SpamComplaint, Delivery and SubscriptionChange
as Postmark's documentation shows them, behind HTTP basic auth."""

from __future__ import annotations

import httpx
import pytest

from tests.api.server import UNTHROTTLED, serve_database
from tests.feedback.conftest import insert_log

URL = "/v1/email/feedback/postmark"
AUTH = ("postmark", "a-long-webhook-password-1234")
ANN = "ann@example.com"
MESSAGE_ID = "883953f4-6105-42a2-a16a-77a8eac79483"


@pytest.fixture(scope="module")
def served(database_url):
    with serve_database(database_url, "svc-key-for-the-postmark-webhook-tests-1",
                        feedback_postmark_username=AUTH[0],
                        feedback_postmark_password=AUTH[1], **UNTHROTTLED) as url:
        yield url


@pytest.fixture
def client(served, clean_db):
    with httpx.Client(base_url=served, timeout=30, auth=AUTH) as c:
        yield c


@pytest.fixture
def sent(engine, tenant):
    with engine.begin() as conn:
        return insert_log(conn, tenant_id=tenant, queue_id=MESSAGE_ID, category="newsletter")


def bounce(**overrides: object) -> dict[str, object]:
    """Postmark's Bounce webhook example."""
    return {"RecordType": "Bounce", "MessageStream": "outbound", "ID": 4323372036854775807,
            "Type": "HardBounce", "TypeCode": 1, "Name": "Hard bounce", "Tag": "Invitation",
            "MessageID": MESSAGE_ID, "Metadata": {"a_key": "a_value", "b_key": "b_value"},
            "ServerID": 23,
            "Description": "The server was unable to deliver your message (ex: unknown "
                           "user, mailbox not found).",
            "Details": "smtp;550 5.1.1 The email account that you tried to reach does not "
                       "exist", "Email": ANN, "From": "sender@example.com",
            "BouncedAt": "2019-11-05T16:33:54.9070259Z", "DumpAvailable": True,
            "Inactive": True, "CanActivate": True, "Subject": "Test subject",
            "Content": "<Full dump of bounce>", **overrides}


def test_a_hard_bounce_is_matched_by_message_id_and_suppresses_once(client, sent, tenant,
                                                                    look):
    for _ in range(2):  # Postmark retries until it gets a 200
        answer = client.post(URL, json=bounce())
        assert answer.status_code == 200, answer.text
    assert answer.json()["data"]["duplicates"] == 1
    (row,) = look.feedback()
    assert (row["tenant_id"], row["email_log_id"], row["matched_by"], row["kind"],
            row["status"], row["source"], row["source_event_id"]) == (
        tenant, sent["id"], "queue_id", "bounced", "5.1.1", "postmark",
        "bounce:4323372036854775807")
    assert row["occurred_at"].isoformat().startswith("2019-11-05T16:33:54.907025")
    assert set(look.suppressed(tenant)) == {(ANN, "")}
    assert [e["event_type"] for e in look.events()] == ["email.bounced"]


def test_soft_bounces_and_blocks_do_not_suppress(client, sent, tenant, look):
    client.post(URL, json=bounce(ID=1, Type="SoftBounce", TypeCode=4096,
                                 Details="452 4.2.2 mailbox full"))
    client.post(URL, json=bounce(ID=2, Type="Blocked", TypeCode=100006,
                                 Details="ISP block"))
    assert {(r["kind"], r["status"]) for r in look.feedback()} == {
        ("soft-bounced", "4.2.2"), ("bounced", "5.7.1")}
    assert look.suppressed(tenant) == {}


def test_complaint_delivery_and_subscription_change(client, sent, tenant, look):
    complaint = bounce(RecordType="SpamComplaint", ID=42, Type="SpamComplaint",
                       TypeCode=100001, Details="Test spam complaint details")
    delivery = {"RecordType": "Delivery", "ServerID": 23, "MessageStream": "outbound",
                "MessageID": MESSAGE_ID, "Recipient": ANN, "Tag": "welcome-email",
                "DeliveredAt": "2019-11-05T16:33:54.9070259Z",
                "Details": "Test delivery webhook details", "Metadata": {"a_key": "a_value"}}
    change = {"RecordType": "SubscriptionChange", "MessageID": MESSAGE_ID, "ServerID": 23,
              "MessageStream": "outbound", "ChangedAt": "2020-02-01T10:53:34.416071Z",
              "Recipient": ANN, "Origin": "Recipient", "SuppressSending": True,
              "SuppressionReason": "ManualSuppression", "Tag": "my-tag",
              "Metadata": {"example": "value"}}
    for record in (delivery, complaint, change, delivery):
        assert client.post(URL, json=record).status_code == 200
    assert sorted(r["kind"] for r in look.feedback()) == ["complaint", "delivered",
                                                          "unsubscribe"]
    assert set(look.suppressed(tenant)) == {(ANN, ""), (ANN, "newsletter")}
    assert look.log(sent["id"])["delivery"] == "complained"
    assert sorted(e["event_type"] for e in look.events()) == [
        "email.complained", "email.delivered", "email.unsubscribed"]


def test_a_spam_notification_is_a_policy_bounce_not_a_complaint(client, sent, tenant, look):
    """A receiving server refused the message as spam (TypeCode 512); Postmark does not
    deactivate the address for it, and no recipient complained."""
    record = bounce(ID=512, Type="SpamNotification", TypeCode=512, Name="Spam notification",
                    Details="smtp;550 permanent failure for one or more recipients "
                            "(X-PowerMTA-BounceCategory: spam-related)", Inactive=False)
    assert client.post(URL, json=record).status_code == 200
    (row,) = look.feedback()
    assert (row["kind"], row["status"], row["suppressed"]) == ("bounced", "5.7.1", False)
    assert look.suppressed(tenant) == {}
    assert [e["event_type"] for e in look.events()] == ["email.bounced"]


@pytest.mark.parametrize(("bounce_type", "details"), [
    ("Blocked", "smtp;421 4.7.0 [TSS04] Messages from 192.0.2.1 temporarily deferred"),
    ("SpamNotification", "smtp;550 5.1.1 rejected as spam"),
    ("DMARCPolicy", "smtp;550 5.2.1 DMARC policy"),
])
def test_a_policy_bounce_is_5_7_1_whatever_code_its_details_quote(client, engine, tenant, look,
                                                                  bounce_type, details):
    """The code in Details won over the type: a Blocked deferral (4.7.0) counted as a soft
    bounce, three suppressed the address; a SpamNotification quoting 5.1.1 suppressed it
    at once."""
    with engine.begin() as conn:
        for i in range(3):
            insert_log(conn, tenant_id=tenant, queue_id=f"{MESSAGE_ID[:-1]}{i}")
    for i in range(3):
        record = bounce(ID=100 + i, Type=bounce_type, Details=details, Inactive=False,
                        MessageID=f"{MESSAGE_ID[:-1]}{i}")
        assert client.post(URL, json=record).status_code == 200
    assert {(r["kind"], r["status"]) for r in look.feedback()} == {("bounced", "5.7.1")}
    assert look.suppressed(tenant) == {}


def test_a_hard_bounce_with_a_class_only_code_suppresses(client, sent, tenant, look):
    """`550 5.0.0 User unknown`: Postmark's HardBounce is its verdict on the address, as
    SES's and SendGrid's class-only codes are; it suppressed nothing."""
    record = bounce(Details="smtp;550 5.0.0 <ann@example.com>... User unknown")
    assert client.post(URL, json=record).status_code == 200
    (row,) = look.feedback()
    assert (row["kind"], row["status"]) == ("bounced", None)
    assert (ANN, "") in look.suppressed(tenant)

def test_a_hard_bounce_and_the_suppression_it_caused_are_one_report(client, sent, tenant,
                                                                   look):
    """Postmark follows a hard bounce's Bounce record with a SubscriptionChange for it (and a
    spam complaint's likewise): recorded both, one bounce made two `email.bounced` events."""
    change = {"RecordType": "SubscriptionChange", "MessageID": MESSAGE_ID, "ServerID": 23,
              "MessageStream": "outbound", "ChangedAt": "2019-11-05T16:33:55.0000000Z",
              "Recipient": ANN, "Origin": "Recipient", "SuppressSending": True,
              "SuppressionReason": "HardBounce", "Tag": "Invitation", "Metadata": {}}
    assert client.post(URL, json=bounce()).status_code == 200
    answer = client.post(URL, json=change)
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"] == {"recorded": 0, "duplicates": 0, "matched": 0,
                                     "ignored": 1}
    assert [(r["kind"], r["source_event_id"]) for r in look.feedback()] == [
        ("bounced", "bounce:4323372036854775807")]
    assert [e["event_type"] for e in look.events()] == ["email.bounced"]


@pytest.mark.parametrize(("suppress", "reason", "kind"), [
    (True, "ManualSuppression", "unsubscribe"), (False, None, "unparsed")])
def test_a_subscription_change_without_a_message_is_kept_unmatched(client, sent, tenant, look,
                                                                   suppress, reason, kind):
    """Postmark: "MessageID is null for Manual Suppressions with Origin value of Customer or
    Admin and Reactivations." Such a record was refused (400), and so never recorded."""
    change = {"RecordType": "SubscriptionChange", "MessageID": None, "ServerID": 123456,
              "MessageStream": "outbound", "ChangedAt": "2020-02-01T10:53:34.416071Z",
              "Recipient": ANN, "Origin": "Customer", "SuppressSending": suppress,
              "SuppressionReason": reason, "Tag": None, "Metadata": {}}
    for _ in range(2):
        answer = client.post(URL, json=change)
        assert answer.status_code == 200, answer.text
    (row,) = look.feedback()
    assert (row["kind"], row["recipient"], row["email_log_id"]) == (kind, ANN, None)
    assert look.suppressed(tenant) == {} and look.events() == []


def test_a_bounce_without_a_message_is_kept_unmatched(client, sent, tenant, look):
    """It was refused (400): Postmark retried it for hours, then dropped it."""
    answer = client.post(URL, json=bounce(MessageID=None))
    assert answer.status_code == 200, answer.text
    (row,) = look.feedback()
    assert (row["kind"], row["recipient"], row["email_log_id"]) == ("bounced", ANN, None)
    assert look.suppressed(tenant) == {} and look.events() == []


def test_wrong_or_missing_credentials_are_401_and_write_nothing(served, sent, tenant, look):
    for auth in (None, ("postmark", "wrong-password-wrong-password"), ("other", AUTH[1])):
        answer = httpx.post(f"{served}{URL}", json=bounce(), auth=auth, timeout=30)
        assert answer.status_code == 401, answer.text
        assert answer.headers["www-authenticate"].startswith("Basic")
    garbled = httpx.post(f"{served}{URL}", json=bounce(), timeout=30,
                         headers={"Authorization": "Basic %%%"})
    assert garbled.status_code == 401
    assert look.feedback() == [] and look.suppressed(tenant) == {}


@pytest.mark.parametrize(("record", "field"), [
    ([], "body"),
    ({"RecordType": "Open"}, "RecordType"),
    ({"RecordType": "Bounce", "Type": "HardBounce", "MessageID": MESSAGE_ID, "ID": 1},
     "Email"),
    (bounce(BouncedAt="yesterday"), "BouncedAt"),
    # Times UTC cannot hold: stored, they made every list of feedback fail to load.
    (bounce(BouncedAt="0001-01-01T00:00:00+14:00"), "BouncedAt"),
    (bounce(BouncedAt="9999-12-31T23:00:00-14:00"), "BouncedAt"),
    (bounce(MessageID=7), "MessageID"),
    ({"RecordType": "SubscriptionChange", "MessageID": MESSAGE_ID, "Recipient": ANN,
      "ChangedAt": "2020-02-01T10:53:34Z", "SuppressSending": "yes"}, "SuppressSending"),
])
def test_a_malformed_record_is_400_naming_the_field(client, sent, look, record, field):
    answer = client.post(URL, json=record)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == field
    assert look.feedback() == []


def test_a_record_nested_deeper_than_64_levels_is_400_naming_the_body(client, sent, look):
    """ServerID is kept in the report's detail as it came: nested some 980 levels deep it
    exhausted the encoder's recursion when the report was written, a 500."""
    body = bounce(ServerID="DEEP")
    raw = httpx.Request("POST", "http://x", json=body).content.replace(
        b'"DEEP"', b"[" * 985 + b"]" * 985)
    answer = client.post(URL, content=raw, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == "body"
    assert look.feedback() == []

def test_without_credentials_configured_the_webhook_is_404(database_url, clean_db):
    with serve_database(database_url, "svc-key-for-the-postmark-webhook-tests-2") as url:
        answer = httpx.post(f"{url}{URL}", json=bounce(), auth=AUTH, timeout=30)
    assert answer.status_code == 404
    assert "POSTMARK" in answer.json()["error"]["message"]
