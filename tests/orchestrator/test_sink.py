"""The scripted sink on its own, driven by the standard library's SMTP client."""

from __future__ import annotations

import mailbox
import smtplib
from pathlib import Path

import pytest

from postrelay.testing import (
    ScriptedHandler,
    SmtpSink,
    accept,
    reply,
    reply_at_data,
)
from tests.orchestrator.smtp_helpers import SENDER, message


def test_rules_match_lower_cased_addresses_first_match_wins() -> None:
    handler = ScriptedHandler([("vip@acme.example", accept()),
                               ("*@acme.example", reply("550 5.1.1 No such user"))])
    with SmtpSink(handler) as sink, smtplib.SMTP(sink.host, sink.port) as client:
        refused = client.sendmail(SENDER, ["VIP@Acme.Example", "ann@acme.example"], message())

    assert refused == {"ann@acme.example": (550, b"5.1.1 No such user")}
    assert handler.count_for("vip@acme.example") == 1
    assert handler.received[0].message["Subject"] == "Hello"
    assert [(r.stage, r.recipients) for r in handler.refusals] == [("rcpt",
                                                                    ("ann@acme.example",))]
    handler.clear()
    assert handler.received == [] and handler.refusals == []


def test_reply_at_data_refuses_the_message() -> None:
    handler = ScriptedHandler({"*@blocked.example": reply_at_data("554 5.7.1 Blocked")})
    with (SmtpSink(handler) as sink, smtplib.SMTP(sink.host, sink.port) as client,
          pytest.raises(smtplib.SMTPDataError)):
        client.sendmail(SENDER, ["ap@blocked.example"], message())

    assert handler.received == []


def test_refusals_need_a_4xx_or_5xx_code() -> None:
    for status in ("250 OK", "hello", "45"):
        with pytest.raises(ValueError):
            reply(status)


def test_maildir_output(tmp_path: Path) -> None:
    folder = tmp_path / "mail"
    with SmtpSink(maildir=folder) as sink, smtplib.SMTP(sink.host, sink.port) as client:
        client.sendmail(SENDER, ["ann@acme.example"], message(subject="Stored"))

    stored = list(mailbox.Maildir(folder, create=False))
    assert [m["Subject"] for m in stored] == ["Stored"]


def test_connections_count_client_sessions_only() -> None:
    with SmtpSink() as sink:
        assert sink.connections == 0  # the controller's readiness probe is not counted
        for _ in range(2):
            with smtplib.SMTP(sink.host, sink.port) as client:
                client.noop()
        assert sink.connections == 2


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
def test_auth_on_a_plain_connection_for_tests() -> None:
    with SmtpSink(auth={"mailer": "pw"}, auth_require_tls=False) as sink:
        with (smtplib.SMTP(sink.host, sink.port) as client,
              pytest.raises(smtplib.SMTPAuthenticationError)):
            client.login("mailer", "nope")
        with smtplib.SMTP(sink.host, sink.port) as client:
            client.login("mailer", "pw")
            client.sendmail(SENDER, ["ann@acme.example"], message())
        assert sink.handler.received[0].login == "mailer"
