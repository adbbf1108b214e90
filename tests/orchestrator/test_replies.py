"""Reply parsing and queue-id recognition: pure, no server."""

from __future__ import annotations

import pytest

from postrelay.orchestrator.transport import Reply, queue_id_from


@pytest.mark.parametrize(
    ("code", "message", "expected"),
    [
        (550, "5.1.1 No such user", Reply(550, "5.1.1", "No such user")),
        (250, "OK", Reply(250, None, "OK")),
        (421, "4.7.0", Reply(421, "4.7.0", "")),
        (250, "2.0.0 first\n2.0.0 second", Reply(250, "2.0.0", "first\nsecond")),
        (550, "5.1 not an enhanced code", Reply(550, None, "5.1 not an enhanced code")),
        (554, "  5.7.1 Blocked by policy  ", Reply(554, "5.7.1", "Blocked by policy")),
    ],
)
def test_reply_parse(code: int, message: str, expected: Reply) -> None:
    assert Reply.parse(code, message) == expected


def test_reply_str() -> None:
    assert str(Reply(550, "5.1.1", "No such user")) == "550 5.1.1 No such user"
    assert str(Reply(250, None, "OK")) == "250 OK"


@pytest.mark.parametrize(
    ("text", "queue_id"),
    [
        ("2.0.0 Ok: queued as 4F3A2B", "4F3A2B"),  # Postfix (enhanced code still on)
        ("Ok: queued as 4F3A2B", "4F3A2B"),  # Postfix, after Reply.parse
        ("250 2.0.0 Ok: queued as 4F3A2B", "4F3A2B"),  # the whole reply line
        ("Ok: queued as NCd2XEb2ECLzGPqbMzqdbg", "NCd2XEb2ECLzGPqbMzqdbg"),  # Mailpit
        ("Message queued as <abc123@mx.example>", "abc123@mx.example"),
        ("Ok: queued as 4F3A2B.", "4F3A2B"),
        ("OK id=1tABCD-000123-XY", "1tABCD-000123-XY"),  # Exim
        ("2.0.0 4BXYZ12345 Message accepted for delivery", "4BXYZ12345"),  # Sendmail
        ("Ok 0100018c8f2f1a2b-3c4d-000000", "0100018c8f2f1a2b-3c4d-000000"),  # Amazon SES
    ],
)
def test_queue_id_known_forms(text: str, queue_id: str) -> None:
    assert queue_id_from(text) == queue_id


@pytest.mark.parametrize(
    "text",
    [
        "", "OK", "2.0.0 Ok", "Ok done", "Ok: queued", "Message accepted",
        "OK id=", "2.6.0 <msg@host> [InternalId=1] Queued mail for delivery",
        "2.0.0 OK 1712345678 a1si123456abc.100 - gsmtp",
    ],
)
def test_queue_id_unknown_forms_give_none(text: str) -> None:
    assert queue_id_from(text) is None
