"""Replays of signed provider webhooks: a SendGrid batch whose signed timestamp, or an SNS
message whose signed Timestamp, is further from the API host's clock than the tolerance is
401 with the reason named and logged, and nothing is written. Before, a request captured
once verified for ever, and each replay cost a signature check and a transaction (and, for
an event without an id of its own, could be written again).

Over real HTTP, as the providers sign: the signatures are good, only the times are off.
"""

from __future__ import annotations

import json
import logging
import time

import httpx
import pytest

from postrelay.orchestrator.feedback.sns import SnsVerifier
from postrelay.orchestrator.feedback.webhook import WebhookAuthError, check_fresh
from tests.api.server import UNTHROTTLED, serve_database
from tests.feedback.conftest import insert_log
from tests.feedback.test_webhook_sendgrid import ANN, PUBLIC, URL, now, signed
from tests.feedback.test_webhook_ses import (
    TOPIC,
    bounce_note,
    pinned,  # noqa: F401  (the served API)
    post,
    sns,
    sns_time,
)

SENDGRID_SETTING = "POSTRELAY_FEEDBACK_SENDGRID_TOLERANCE_SECS"
SES_SETTING = "POSTRELAY_FEEDBACK_SES_TOLERANCE_SECS"


@pytest.fixture(scope="module")
def sendgrid_served(database_url):
    with serve_database(database_url, "svc-key-for-the-webhook-replay-tests-0001",
                        feedback_sendgrid_public_key=PUBLIC, **UNTHROTTLED) as url:
        yield url


@pytest.fixture
def sendgrid(sendgrid_served, clean_db):
    with httpx.Client(base_url=sendgrid_served, timeout=30) as c:
        yield c


@pytest.fixture
def ses(pinned, clean_db):  # noqa: F811
    with httpx.Client(base_url=pinned, timeout=30) as c:
        yield c


def refused(answer: httpx.Response, provider: str) -> str:
    assert answer.status_code == 401, answer.text
    problem = answer.json()["error"]
    assert problem["code"] == "unauthorized"
    assert problem["message"].startswith(f"{provider} webhook: ")
    return str(problem["message"])


def bounce(message_id: str, event_id: str = "b-1") -> list[dict[str, object]]:
    return [{"email": ANN, "event": "bounce", "status": "5.1.1", "sg_event_id": event_id,
             "smtp-id": message_id, "timestamp": 1700000000}]


@pytest.mark.parametrize(("offset", "said"), [(-90_001, "s old"), (-86_400 * 400, "s old"),
                                              (90_001, "s ahead of this host's clock")])
def test_a_sendgrid_batch_signed_outside_a_day_and_an_hour_is_refused(
        sendgrid, engine, tenant, look, caplog, offset, said):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    with caplog.at_level(logging.WARNING, logger="postrelay"):
        message = refused(sendgrid.post(URL, **signed(bounce(sent["message_id"]),
                                                      stamp=now(offset))), "sendgrid")
    assert "X-Twilio-Email-Event-Webhook-Timestamp is " in message and said in message
    assert f"more than the 90000 s allowed ({SENDGRID_SETTING})" in message
    (record,) = [r for r in caplog.records
                 if getattr(r, "event", None) == "postrelay.feedback.webhook_refused"]
    assert record.fields["provider"] == "sendgrid"  # type: ignore[attr-defined]
    assert said in record.fields["reason"]  # type: ignore[attr-defined]
    assert look.feedback() == [] and look.suppressed(tenant) == {} and look.events() == []


def test_a_sendgrid_batch_within_the_tolerance_is_taken(sendgrid, engine, tenant, look):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    # A retry a day after the first try, signed then; a clock a little ahead.
    for i, offset in enumerate((-86_400 - 290, 0, 290)):
        answer = sendgrid.post(URL, **signed(bounce(sent["message_id"], f"b-{i}"),
                                             stamp=now(offset)))
        assert answer.status_code == 200, answer.text
    assert len(look.feedback()) == 3


@pytest.mark.parametrize("stamp", ["noon", "+1700000000", "1_700_000_000", "1e9", "1" * 13,
                                   "-5"])
def test_a_sendgrid_timestamp_that_is_no_unix_time_is_refused(sendgrid, look, stamp):
    message = refused(sendgrid.post(URL, **signed(bounce("<m@x>"), stamp=stamp)), "sendgrid")
    assert "is not a Unix time in seconds" in message
    assert look.feedback() == []


def test_the_sendgrid_tolerance_is_a_setting(database_url, clean_db, look):
    with serve_database(database_url, "svc-key-for-the-webhook-replay-tests-0002",
                        feedback_sendgrid_public_key=PUBLIC,
                        feedback_sendgrid_tolerance_secs=30, **UNTHROTTLED) as url, \
            httpx.Client(base_url=url, timeout=30) as client:
        message = refused(client.post(URL, **signed(bounce("<m@x>"), stamp=now(-60))),
                          "sendgrid")
        assert f"more than the 30 s allowed ({SENDGRID_SETTING})" in message
        assert client.post(URL, **signed(bounce("<m@x>"), stamp=now(-20))).status_code == 200


# --- SES through SNS: the pinned-certificate server of test_webhook_ses ----------------------

NOWHERE = "https://sns.us-west-2.amazonaws.com/SimpleNotificationService-0000.pem"


@pytest.mark.parametrize(("offset", "said"), [(-7201, "s old"), (-86_400 * 400, "s old"),
                                              (7201, "s ahead of this host's clock")])
def test_an_sns_message_signed_outside_two_hours_is_refused(
        ses, engine, tenant, look, offset, said):
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=(ANN,))
    message = sns("Notification", bounce_note(sent["message_id"]), cert_url=NOWHERE,
                  Timestamp=sns_time(offset))
    said_to_sns = refused(post(ses, message), "ses")
    assert said_to_sns.startswith("ses webhook: Timestamp is ") and said in said_to_sns
    assert f"more than the 7200 s allowed ({SES_SETTING})" in said_to_sns
    assert look.feedback() == [] and look.suppressed(tenant) == {} and look.events() == []


def test_an_sns_retry_at_the_end_of_the_longest_delivery_policy_is_taken(
        ses, engine, tenant, look):
    """SNS resends a message as it signed it, Timestamp included, and an HTTP/S delivery
    policy retries for at most 3600 s: such a retry, a little late, is still recorded."""
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant, recipients=(ANN,))
    message = sns("Notification", bounce_note(sent["message_id"]), cert_url=NOWHERE,
                  Timestamp=sns_time(-3600 - 300))
    answer = post(ses, message)
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"]["recorded"] == 1


def test_a_stale_sns_message_is_refused_before_its_certificate_is_fetched():
    """The URL is on an allowed host and nothing answers there: a fetch would be a 503,
    which SNS retries; the replay is a 401 without one."""
    verifier = SnsVerifier({TOPIC}, tolerance_secs=7200, host_pattern=r"127\.0\.0\.1")
    message = sns("Notification", json.dumps({"notificationType": "Bounce"}),
                  cert_url="https://127.0.0.1:9/cert.pem", Timestamp=sns_time(-7300))
    with pytest.raises(WebhookAuthError, match="Timestamp is 7300 s old"):
        verifier.verify(message)
    fresh = sns("Notification", json.dumps({"notificationType": "Bounce"}),
                cert_url="https://127.0.0.1:9/cert.pem", Timestamp=sns_time(0))
    with pytest.raises(WebhookAuthError, match="Timestamp is 100 s old, more than the 60 s"):
        SnsVerifier({TOPIC}, tolerance_secs=60, host_pattern=r"127\.0\.0\.1").verify(
            fresh, now=time.time() + 100)


def test_the_window_is_inclusive_and_the_same_both_ways():
    check_fresh("t", 1000.0, 1300.0, 300, "S")
    check_fresh("t", 1300.0, 1000.0, 300, "S")
    for signed_at in (999.0, 1601.0):
        with pytest.raises(WebhookAuthError, match=r"more than the 300 s allowed \(S\)"):
            check_fresh("t", signed_at, 1300.0, 300, "S")
