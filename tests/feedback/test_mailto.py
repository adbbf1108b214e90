"""The `mailto:` unsubscribe of List-Unsubscribe: bulk mail sent for real offers it, a mail
client's message to it arrives through the real inbound listener, and the address stops
getting that category (and only that)."""

from __future__ import annotations

import email
import re
import uuid
from email.message import EmailMessage
from urllib.parse import unquote, urlsplit

import pytest

from postrelay.orchestrator import UnsubscribeLinks
from postrelay.orchestrator.feedback import SuppressionPolicy
from postrelay.orchestrator.feedback.inbound import InboundConfig, InboundServer
from postrelay.orchestrator.feedback.ingest import read_mail
from postrelay.orchestrator.feedback.mailto import mailto_unsubscribe
from tests.feedback.conftest import BOUNCE_DOMAIN, SECRET, await_inbox_empty
from tests.feedback.test_inbound import deliver, free_port
from tests.orchestrator.conftest import write_template

ANN = "ann@example.com"
LINKS = UnsubscribeLinks("https://mail.acme.example", SECRET, BOUNCE_DOMAIN)


@pytest.fixture
def inbound(receiver_engine, return_path, clean_db):
    config = InboundConfig(host="127.0.0.1", port=free_port(), unsubscribe=LINKS)
    with InboundServer(receiver_engine, return_path, SuppressionPolicy(), config) as server:
        yield server


def client_mail(mailto: str) -> bytes:
    """What a mail client sends for a mailto: URI (RFC 6068): To and Subject from it."""
    parts = urlsplit(mailto)
    subject = unquote(dict(p.split("=", 1) for p in parts.query.split("&"))["subject"])
    message = EmailMessage()
    message["From"] = f"Ann <{ANN}>"
    message["To"] = parts.path
    message["Subject"] = subject
    message.set_content("Please unsubscribe me.")
    return message.as_bytes()


async def test_bulk_mail_offers_mailto_and_it_unsubscribes_only_its_category(
        rig, tenant, sink, engine, templates_dir, inbound, look):
    write_template(templates_dir, "digest", "Your digest", "News.\n",
                   toml="unsubscribe = true\n")
    first = rig.enqueue(tenant, to=[ANN], template="digest", category="newsletter")
    await rig.start(unsubscribe=LINKS)
    await rig.settle(first)
    (received,) = sink.handler.received
    header = " ".join(received.message["List-Unsubscribe"].split())
    uris = re.findall(r"<([^>]+)>", header)
    token = LINKS.token(tenant, ANN, "newsletter")
    assert uris == [f"https://mail.acme.example/u/{token}",
                    f"mailto:unsubscribe@{BOUNCE_DOMAIN}?subject=unsubscribe%20{token}"]

    for _ in range(2):  # a client that sends twice changes nothing the second time
        code, _ = await deliver(inbound, f"unsubscribe@{BOUNCE_DOMAIN}", client_mail(uris[1]))
        assert code == 250
        await await_inbox_empty(look.engine)
    assert set(look.suppressed(tenant)) == {(ANN, "newsletter")}
    (row,) = look.feedback()
    assert (row["kind"], row["source"], row["recipient"], row["suppressed"],
            row["detail"]["format"]) == ("unsubscribe", "mail", ANN, True, "mailto")
    assert [e["event_type"] for e in look.events()] == ["email.unsubscribed"]

    stopped = rig.enqueue(tenant, to=[ANN], template="digest", category="newsletter")
    flowing = rig.enqueue(tenant, to=[ANN], template="digest", category="billing")
    await rig.settle(stopped, flowing)
    assert [r["status"] for r in rig.log(stopped)] == ["suppressed"]
    assert [r["status"] for r in rig.log(flowing)] == ["sent"]


async def test_a_tampered_or_foreign_token_is_kept_and_suppresses_nothing(
        inbound, tenant, look):
    token = LINKS.token(tenant, ANN, "newsletter")
    forged = UnsubscribeLinks("https://x.example", b"another-secret-0123456789").token(
        tenant, ANN, "newsletter")
    for bad in (token[:-2] + ("AA" if not token.endswith("AA") else "BB"), forged, ""):
        mailto = f"mailto:unsubscribe@{BOUNCE_DOMAIN}?subject=unsubscribe%20{bad}"
        code, _ = await deliver(inbound, f"unsubscribe@{BOUNCE_DOMAIN}", client_mail(mailto))
        assert code == 250  # accepted and kept for an operator, never lost
    await await_inbox_empty(look.engine)
    assert look.suppressed(tenant) == {}
    assert {r["kind"] for r in look.feedback()} <= {"unparsed", "auto-reply"}
    assert len(look.feedback()) == 3 and look.events() == []


async def test_a_new_mail_after_the_suppression_was_lifted_unsubscribes_again(
        inbound, tenant, engine, look):
    """Every mail of the category offers the same mailto:. A new message to it after the
    address was let back in stops the mail again; the old message delivered again (an
    MTA's retry, an ingest that reads the folder again) does not."""
    from postrelay.orchestrator import suppression_remove

    mailto = f"mailto:unsubscribe@{BOUNCE_DOMAIN}?subject=unsubscribe%20" \
             f"{LINKS.token(tenant, ANN, 'newsletter')}"

    def sent(n):
        message = email.message_from_bytes(client_mail(mailto))
        message["Message-ID"] = f"<unsubscribe-{n}@client.example>"
        return message.as_bytes()

    async def send(raw):
        code, _ = await deliver(inbound, f"unsubscribe@{BOUNCE_DOMAIN}", raw)
        assert code == 250
        await await_inbox_empty(look.engine)

    await send(sent(1))
    with engine.begin() as conn:
        suppression_remove(conn, ANN, tenant_id=tenant, actor="preferences",
                           category="newsletter")
    await send(sent(1))
    assert look.suppressed(tenant) == {}
    await send(sent(2))
    await send(sent(3))  # while unsubscribed, another message changes nothing
    assert set(look.suppressed(tenant)) == {(ANN, "newsletter")}
    assert [(r["kind"], r["suppressed"]) for r in look.feedback()] == [
        ("unsubscribe", True), ("unsubscribe", True)]
    assert [e["event_type"] for e in look.events()] == ["email.unsubscribed"] * 2


def test_without_a_bounce_domain_there_is_no_mailto():
    links = UnsubscribeLinks("https://mail.acme.example", SECRET)
    assert links.mailto_address is None
    assert "mailto:" not in links.headers(uuid.uuid4(), ANN, "n")["List-Unsubscribe"]


def unsubscribe_mail(to: str, token: str) -> bytes:
    return (f"From: Ann <{ANN}>\r\nTo: {to}\r\nSubject: unsubscribe {token}\r\n"
            "\r\nPlease unsubscribe me.\r\n").encode()


@pytest.mark.parametrize("to", [
    f"unsubscribe@{BOUNCE_DOMAIN}",
    f"Lists <UNSUBSCRIBE@{BOUNCE_DOMAIN.upper()}>",
    f"UnSubscribe (the list)\r\n @ {BOUNCE_DOMAIN}",  # folded, a comment, spaces at the @
])
def test_a_mailto_named_in_to_alone_is_read(to):
    """`postrelay feedback ingest` hands over no envelope: To must be enough, however an
    address is spelled."""
    tenant = uuid.uuid4()
    found = mailto_unsubscribe(unsubscribe_mail(to, LINKS.token(tenant, ANN, "news")), [],
                               LINKS)
    assert found is not None
    assert (found.kind, found.tenant_id, found.recipient, found.category) == (
        "unsubscribe", tenant, ANN, "news")


def test_a_mailto_named_in_the_envelope_alone_is_read():
    """A Bcc, or a forward: the header block does not name the mailbox, the envelope does."""
    tenant = uuid.uuid4()
    raw = unsubscribe_mail("Ann <ann@example.com>", LINKS.token(tenant, ANN, "news"))
    assert mailto_unsubscribe(raw, [], LINKS) is None
    found = mailto_unsubscribe(raw, [f"<Unsubscribe@{BOUNCE_DOMAIN}>"], LINKS)
    assert found is not None and (found.tenant_id, found.category) == (tenant, "news")


def test_a_broken_encoded_word_in_the_subject_is_read_as_it_is():
    """`=?UTF-8?B?dW5zd?=` (its base64 cut short) made email's decoder raise, and the
    message was lost: `postrelay feedback ingest` stopped at it, and the inbox's batch
    failed. The subject is read as it came; a token after the broken word still counts."""
    tenant = uuid.uuid4()
    token = LINKS.token(tenant, ANN, "news")
    to = f"unsubscribe@{BOUNCE_DOMAIN}"
    broken = unsubscribe_mail(to, f"=?UTF-8?B?dW5zd?= {token}")
    found = mailto_unsubscribe(broken, [], LINKS)
    assert found is not None and (found.tenant_id, found.category) == (tenant, "news")
    alone = unsubscribe_mail(to, "=?UTF-8?B?dW5zd?=")
    assert mailto_unsubscribe(alone, [], LINKS) is None
    (report,) = read_mail(alone, return_path=None, unsubscribe=LINKS)
    assert report.kind == "unparsed"
