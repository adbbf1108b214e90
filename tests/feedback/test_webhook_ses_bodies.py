"""SES notifications whose Message (the JSON text SNS signs) is of an odd shape, over real
HTTP with a pinned signing certificate: each is a 400 naming the field, nothing written."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.feedback.test_webhook_ses import (  # noqa: F401
    NOWHERE,
    URL,
    bounce_note,
    pinned,
    post,
    sns,
)


@pytest.fixture
def client(pinned, clean_db):  # noqa: F811
    with httpx.Client(base_url=pinned, timeout=30) as c:
        yield c


@pytest.mark.parametrize("message", [
    "[" * 100_000 + "]" * 100_000,  # deeper than the decoder recurses
    # Decoded, but the report's detail keeps `action` as it came, which nested so deep
    # exhausted the encoder's recursion when it was written.
    bounce_note("<x@y.example>", bouncedRecipients=[{"emailAddress": "ann@example.com",
                                                     "action": "DEEP"}]).replace(
        '"DEEP"', "[" * 985 + "]" * 985),
    '{"notificationType": ' + "9" * 5000 + "}",  # more digits than Python converts
])
def test_a_message_json_cannot_hold_is_400_naming_it(client, tenant, look, message):
    answer = post(client, sns("Notification", message, cert_url=NOWHERE))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == "Message"
    assert look.feedback() == [] and look.events() == []


@pytest.mark.parametrize("where", ["Subject", "Message", "MessageId"])
def test_a_lone_surrogate_in_a_signed_field_is_401_not_500(client, tenant, look, where):
    """JSON may escape half a surrogate pair (`\\ud800`), which SNS never sends: the text to
    verify could not be encoded, and anyone who knew the topic's ARN got a 500, which SNS
    and its imitators retry for hours."""
    message = sns("Notification", bounce_note("<x@y.example>"), cert_url=NOWHERE,
                  Subject="Amazon SES Email Event Notification")
    body = json.dumps({**message, where: "HALF"}).replace('"HALF"', '"\\ud800"')
    answer = client.post(URL, content=body.encode(),
                         headers={"Content-Type": "text/plain; charset=UTF-8"})
    assert answer.status_code == 401, answer.text
    assert look.feedback() == [] and look.events() == []
