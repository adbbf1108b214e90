"""One-click unsubscribe (RFC 8058): signed links in bulk mail, the real HTTP endpoint, and
the category's mail stopping while another category's keeps flowing."""

from __future__ import annotations

import asyncio
import html
import re
import uuid
from urllib.parse import urljoin

import httpx
import pytest

from postrelay.core.errors import ConfigError, ValidationError
from postrelay.core.settings import load_settings
from postrelay.orchestrator import UnsubscribeLinks
from postrelay.orchestrator.feedback.unsubscribe import UnsubscribeTokenError
from tests.api.server import serve_database
from tests.feedback.conftest import SECRET
from tests.orchestrator.conftest import SENDER, write_template

ANN = "ann@example.com"


def test_a_token_names_tenant_recipient_and_category_and_cannot_be_changed():
    links = UnsubscribeLinks("https://mail.acme.example/", SECRET)
    tenant = uuid.uuid4()
    token = links.token(tenant, "Ann@Example.com", "newsletter")
    assert links.verify(token) == (tenant, ANN, "newsletter")
    body, _, mac = token.partition(".")
    forged = links.token(tenant, "bob@example.com", "newsletter").partition(".")[0]
    tampered = mac[:-2] + ("AA" if mac[-2:] != "AA" else "BB")  # never the MAC itself
    for bad in (f"{forged}.{mac}", f"{body}.{tampered}", "nonsense", f"{body}.",
                UnsubscribeLinks("https://x.example", b"another-secret-0123456789").token(
                    tenant, ANN, "newsletter")):
        with pytest.raises(UnsubscribeTokenError):
            links.verify(bad)
    assert links.headers(tenant, ANN, "newsletter") == {
        "List-Unsubscribe": f"<https://mail.acme.example/u/{token}>",
        "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}


def test_links_signed_before_a_rotation_still_unsubscribe():
    """A link stays in the mailbox for months: while the old secret is kept as the previous
    one, its links still unsubscribe; new links are signed with the new secret."""
    old, new = b"old-secret-0123456789", b"new-secret-0123456789"
    tenant = uuid.uuid4()
    before = UnsubscribeLinks("https://mail.acme.example", old).token(tenant, ANN, "news")
    links = UnsubscribeLinks("https://mail.acme.example", new, previous=old)
    assert links.verify(before) == (tenant, ANN, "news")
    assert UnsubscribeLinks("https://mail.acme.example", new).verify(
        links.token(tenant, ANN, "news")) == (tenant, ANN, "news")
    with pytest.raises(UnsubscribeTokenError):
        UnsubscribeLinks("https://mail.acme.example", new).verify(before)
    with pytest.raises(ValidationError, match="feedback_secret_previous"):
        UnsubscribeLinks("https://mail.acme.example", new, previous=b"short")
    configured = UnsubscribeLinks.from_settings(load_settings(
        public_url="https://mail.acme.example", feedback_secret=new.decode(),
        feedback_secret_previous=old.decode()))
    assert configured is not None and configured.verify(before) == (tenant, ANN, "news")


def test_the_public_url_is_https_or_loopback():
    UnsubscribeLinks("http://127.0.0.1:8000", SECRET)
    UnsubscribeLinks("http://localhost:8000", SECRET)
    with pytest.raises(ValidationError, match="public_url"):
        UnsubscribeLinks("http://mail.acme.example", SECRET)


@pytest.mark.parametrize("url", ["https://acme.example/mail?x=1", "https://acme.example/mail#top",
                                 "https://user:pw@acme.example", "https://acme.example:99999",
                                 "https://acme.example:0", "https://"])
def test_a_public_url_that_is_no_base_for_a_path_is_refused(url):
    """The link is the URL, `/u/` and the token: after a query or a fragment the token
    was no part of the path (a POST to `/mail`), and a user and password went into every
    mail."""
    with pytest.raises(ValidationError, match="public_url: must be scheme, host"):
        UnsubscribeLinks(url, SECRET)
    UnsubscribeLinks("https://acme.example:8443/mail/", SECRET)

def test_the_api_refuses_to_start_with_a_bad_public_url(database_url):
    """The links were made at each request: a bad URL started, and every /u/ link
    answered 500."""
    from postrelay.api.app import create_app
    from postrelay.core.db import Database, sqlalchemy_url
    from postrelay.core.settings import Settings

    db = Database(url=sqlalchemy_url(database_url))
    try:
        with pytest.raises(ConfigError, match="POSTRELAY_PUBLIC_URL: must be scheme, host"):
            create_app(Settings(database_url=database_url, service_role_key="k" * 32,
                                public_url="https://acme.example/mail?x=1",
                                feedback_secret=SECRET.decode()), db)
    finally:
        db.close()

@pytest.mark.parametrize("url", ["https://post.bücher.example", "https://mail.acme.example/a b"])
def test_a_public_url_no_header_can_hold_as_it_is_is_refused(url, monkeypatch):
    """RFC 2369 puts the link in List-Unsubscribe as it is. A host in Unicode was written
    as RFC 2047 encoded-words (no link a reader can take out of its brackets), a blank
    breaks the link at the fold; both were taken, and the mail went out `sent`."""
    with pytest.raises(ValidationError, match="public_url: must be ASCII without blanks"):
        UnsubscribeLinks(url, SECRET)
    UnsubscribeLinks("https://post.xn--bcher-kva.example", SECRET)
    monkeypatch.setenv("POSTRELAY_PUBLIC_URL", url)
    monkeypatch.setenv("POSTRELAY_FEEDBACK_SECRET", SECRET.decode())
    with pytest.raises(ConfigError, match="POSTRELAY_PUBLIC_URL: must be ASCII"):
        UnsubscribeLinks.from_settings(load_settings())


@pytest.mark.parametrize("too_long", ["n" * 101, "\U0001f4f0" * 26])
def test_a_category_is_a_name_of_at_most_100_bytes(engine, tenant, too_long):
    """The category rides in the unsubscribe link, and a long one made the header too long
    for a line: it went out as RFC 2047 words, no link at all. The token carries its UTF-8
    bytes: a hundred emoji (400 bytes) passed a limit of 100 characters and did the same.
    It is also the suppression list's key."""
    from postrelay.orchestrator import EmailJob, email_route, enqueue_email
    from postrelay.relay import RouteRegistry

    with pytest.raises(ValidationError, match="category: at most 100 bytes as UTF-8"):
        email_route("x", template="t", to="a@example.com", category=too_long,
                    unsubscribe=True, routes=RouteRegistry())
    with pytest.raises(ValidationError, match="category: at most 100 bytes as UTF-8"), \
            engine.begin() as conn:
        enqueue_email(conn, EmailJob(template="t", to=("a@example.com",), category=too_long),
                      tenant_id=tenant)
    with engine.begin() as conn:
        enqueue_email(conn, EmailJob(template="t", to=("a@example.com",), category="n" * 100,
                                     unsubscribe=True), tenant_id=tenant)


def form_target(page: str, url: str) -> str:
    """Where a browser posts the page's form, the page being at `url`."""
    (form,) = re.findall(r"<form\b[^>]*>", page)
    action = re.search(r'\baction="([^"]*)"', form)
    return urljoin(url, html.unescape(action[1])) if action and action[1] else url


@pytest.fixture
def served(database_url):
    with serve_database(database_url, "svc-key-for-the-unsubscribe-tests-0123",
                        public_url="http://127.0.0.1", feedback_secret=SECRET.decode()) as url:
        yield url


def test_get_shows_a_button_post_unsubscribes_once_and_bad_tokens_write_nothing(
        served, tenant, look):
    links = UnsubscribeLinks("http://127.0.0.1", SECRET)
    token = links.token(tenant, ANN, "newsletter")
    with httpx.Client(base_url=served, timeout=30) as client:
        page = client.get(f"/u/{token}")
        assert page.status_code == 200 and "<form method=\"post\"" in page.text
        # A link checker's HEAD (RFC 9110: a server supports GET and HEAD) was 405.
        head = client.head(f"/u/{token}")
        assert (head.status_code, head.content) == (200, b"")
        # Its button posts back to the link as opened, also where a proxy serves the API
        # under a path (POSTRELAY_PUBLIC_URL=https://acme.example/mail).
        opened = f"https://acme.example/mail/u/{token}"
        assert form_target(page.text, opened) == opened
        assert look.feedback() == [] and look.suppressed(tenant) == {}
        for _ in range(2):
            done = client.post(f"/u/{token}", content="List-Unsubscribe=One-Click",
                               headers={"Content-Type": "application/x-www-form-urlencoded"})
            assert done.status_code == 200 and "Unsubscribed" in done.text
        tampered = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
        assert client.post(f"/u/{tampered}").status_code == 400
        assert client.get(f"/u/{tampered}").status_code == 400
    assert set(look.suppressed(tenant)) == {(ANN, "newsletter")}
    (row,) = look.feedback()
    assert (row["kind"], row["source"], row["suppressed"]) == ("unsubscribe", "one-click", True)
    assert [e["event_type"] for e in look.events()] == ["email.unsubscribed"]


async def test_bulk_mail_carries_the_link_and_an_unsubscribe_stops_only_its_category(
        rig, tenant, sink, engine, templates_dir):
    write_template(templates_dir, "digest", "Your digest", "News.\n",
                   toml="unsubscribe = true\n")
    links = UnsubscribeLinks("https://mail.acme.example", SECRET)
    first = rig.enqueue(tenant, to=[ANN], template="digest", category="newsletter")
    await rig.start(unsubscribe=links)
    await rig.settle(first)
    (received,) = sink.handler.received
    token = links.token(tenant, ANN, "newsletter")
    # A long value is folded onto its own line: unfolded, it is the link.
    assert received.message["List-Unsubscribe"].strip() == f"<https://mail.acme.example/u/{token}>"
    assert received.message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    plain = rig.enqueue(tenant, to=[ANN], template="welcome")
    await rig.settle(plain)
    assert sink.handler.received[-1].message["List-Unsubscribe"] is None  # transactional

    from postrelay.orchestrator.feedback import Feedback, record_feedback

    with engine.begin() as conn:
        record_feedback(conn, Feedback(kind="unsubscribe", source="one-click", recipient=ANN,
                                       tenant_id=tenant, category="newsletter", vouched=True,
                                       source_event_id=token))
    stopped = rig.enqueue(tenant, to=[ANN], template="digest", category="newsletter")
    flowing = rig.enqueue(tenant, to=[ANN], template="digest", category="billing")
    # Transactional mail that shares the category (a password reset, say) carries no link,
    # and an unsubscribe does not stop it; it stopped it before.
    transactional = rig.enqueue(tenant, to=[ANN], template="welcome", category="newsletter")
    await rig.settle(stopped, flowing, transactional)
    assert [r["status"] for r in rig.log(stopped)] == ["suppressed"]
    assert [r["status"] for r in rig.log(flowing)] == ["sent"]
    assert [r["status"] for r in rig.log(transactional)] == ["sent"]


def route_jobs(engine, event_id) -> dict[str, uuid.UUID]:
    """The email_send jobs the relay made of one event, by route name."""
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT idempotency_key, id FROM mdm.aa_job WHERE job_kind = 'email_send' "
            "AND idempotency_key LIKE :key"), {"key": f"outbox:{event_id}:%"}).all()
    return {key.split(":", 2)[2]: job_id for key, job_id in rows}


async def test_a_route_marks_its_mail_bulk_and_an_unsubscribe_stops_only_its_category(
        rig, tenant, sink, engine, async_engine, served, look):
    """The same transactional template through three routes: the two marked bulk carry the
    one-click headers with their own category, the unmarked one does not; unsubscribing
    through the link (real HTTP) stops that category's route only. A marked route without
    a category unsubscribes by its template's name, and that stops it too."""
    from postrelay.orchestrator import email_route
    from postrelay.relay import Relay, RouteRegistry, emit

    routes = RouteRegistry()
    email_route("post.published", template="welcome", to="user.email", category="newsletter",
                unsubscribe=True, sender=SENDER, name="newsletter", routes=routes)
    email_route("post.published", template="welcome", to="user.email", category="offers",
                unsubscribe=True, sender=SENDER, name="offers", routes=routes)
    email_route("post.published", template="welcome", to="user.email", sender=SENDER,
                name="notice", routes=routes)
    email_route("post.published", template="invoice", to="user.email", sender=SENDER,
                unsubscribe=True, name="digest", routes=routes)  # category: the template's
    relay = Relay(async_engine, routes)

    async def publish() -> dict[str, uuid.UUID]:
        with engine.begin() as conn:
            event_id = emit(conn, "post.published", {"user": {"name": "Ann", "email": ANN},
                                                     "number": "I-1"},
                            tenant_id=tenant, aggregate_type="post", aggregate_id="p-1")
        assert (await relay.run_once()).jobs == 4
        jobs = route_jobs(engine, event_id)
        await rig.settle(*jobs.values())
        return jobs

    links = UnsubscribeLinks(served, SECRET)
    await rig.start(unsubscribe=links)
    first = await publish()
    by_job = {rig.log(job)[0]["message_id"]: name for name, job in first.items()}
    received = {by_job[m.message["Message-ID"]]: m.message for m in sink.handler.received}
    assert set(received) == {"newsletter", "offers", "notice", "digest"}
    for name, category in (("newsletter", "newsletter"), ("offers", "offers"),
                           ("digest", "invoice")):
        token = links.token(tenant, ANN, category)
        assert received[name]["List-Unsubscribe"].strip() == f"<{served}/u/{token}>"
        assert received[name]["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert received["notice"]["List-Unsubscribe"] is None
    assert received["notice"]["List-Unsubscribe-Post"] is None

    async with httpx.AsyncClient(timeout=30) as client:
        for name in ("newsletter", "digest"):
            link = received[name]["List-Unsubscribe"].strip().strip("<>")
            answer = await client.post(link, content="List-Unsubscribe=One-Click", headers={
                "Content-Type": "application/x-www-form-urlencoded"})
            assert answer.status_code == 200
    assert set(look.suppressed(tenant)) == {(ANN, "newsletter"), (ANN, "invoice")}

    again = await publish()
    assert [r["status"] for r in rig.log(again["newsletter"])] == ["suppressed"]
    assert [r["status"] for r in rig.log(again["digest"])] == ["suppressed"]
    assert [r["status"] for r in rig.log(again["offers"])] == ["sent"]
    assert [r["status"] for r in rig.log(again["notice"])] == ["sent"]


def test_a_route_refuses_an_unsubscribe_mark_it_cannot_keep():
    from postrelay.orchestrator import EmailJob, email_route
    from postrelay.relay import RouteRegistry

    with pytest.raises(ValidationError, match="unsubscribe: must be True or False"):
        email_route("x", template="t", to="a@example.com", unsubscribe="newsletter",  # type: ignore[arg-type]
                    routes=RouteRegistry())
    with pytest.raises(ValidationError, match="category: must be a non-empty string"):
        email_route("x", template="t", to="a@example.com", category=" ", unsubscribe=True,
                    routes=RouteRegistry())
    with pytest.raises(ValidationError, match="unsubscribe: must be true or false"):
        EmailJob.from_payload({"template": "t", "to": ["a@example.com"], "unsubscribe": "yes"})
    payload = EmailJob(template="t", to=("a@example.com",)).to_payload()
    assert "unsubscribe" not in payload  # unmarked: the payload as before the flag
    assert EmailJob.from_payload({**payload, "unsubscribe": True}).unsubscribe is True


def test_a_click_after_the_suppression_was_lifted_unsubscribes_again(served, tenant, engine,
                                                                      look):
    """The link is the same in every mail of the category. Once the address is let back in
    (it subscribed again and the application lifted the suppression), the next click on
    any of those links must stop the mail again, not be taken for the earlier click."""
    from postrelay.orchestrator import suppression_remove

    token = UnsubscribeLinks("http://127.0.0.1", SECRET).token(tenant, ANN, "newsletter")
    with httpx.Client(base_url=served, timeout=30) as client:
        assert client.post(f"/u/{token}").status_code == 200
        with engine.begin() as conn:
            suppression_remove(conn, ANN, tenant_id=tenant, actor="preferences",
                               category="newsletter")
        assert look.suppressed(tenant) == {}
        for _ in range(2):  # and a second click after that changes nothing again
            assert client.post(f"/u/{token}").status_code == 200
    assert set(look.suppressed(tenant)) == {(ANN, "newsletter")}
    assert [(r["kind"], r["suppressed"]) for r in look.feedback()] == [
        ("unsubscribe", True), ("unsubscribe", True)]
    assert [e["event_type"] for e in look.events()] == ["email.unsubscribed"] * 2


def test_clicks_made_at_once_unsubscribe_once(served, tenant, look):
    """A double click on the page's button, or a mail client and its user both posting:
    the clicks race, and still one report, one suppression and one event come of them."""
    token = UnsubscribeLinks("http://127.0.0.1", SECRET).token(tenant, ANN, "newsletter")

    async def clicks() -> list[int]:
        async with httpx.AsyncClient(base_url=served, timeout=30) as client:
            answers = await asyncio.gather(*(client.post(f"/u/{token}") for _ in range(8)))
        return [answer.status_code for answer in answers]

    assert asyncio.run(clicks()) == [200] * 8
    assert set(look.suppressed(tenant)) == {(ANN, "newsletter")}
    assert [(r["kind"], r["suppressed"]) for r in look.feedback()] == [("unsubscribe", True)]
    assert [e["event_type"] for e in look.events()] == ["email.unsubscribed"]



def test_a_link_of_a_deleted_tenant_answers_and_is_kept(served, gone_tenant, look):
    """A recipient clicking the link of an old message of a tenant deleted since: it gets no
    more of that mail anyway, and the click is kept for an operator."""
    token = UnsubscribeLinks("http://127.0.0.1", SECRET).token(gone_tenant, ANN, "newsletter")
    with httpx.Client(base_url=served, timeout=30) as client:
        # Clicked again and again (or posted by a bot): no suppression can stand for a
        # deleted tenant to leave later clicks out, and each one was a row of its own.
        answers = [client.post(f"/u/{token}") for _ in range(3)]
    assert all(a.status_code == 200 and "Unsubscribed" in a.text for a in answers)
    ((kind, tenant_id, detail),) = [(r["kind"], r["tenant_id"], r["detail"])
                                    for r in look.feedback()]
    assert (kind, tenant_id, detail["tenant_gone"]) == ("unsubscribe", None, str(gone_tenant))
    assert look.events() == []


async def test_bulk_mail_sent_without_links_is_told_to_the_operator_once(
        rig, tenant, sink, templates_dir, caplog):
    """Without POSTRELAY_PUBLIC_URL (or the secret) bulk mail goes out without the
    one-click link Gmail and Yahoo require of bulk senders; it went out `sent` in silence."""
    write_template(templates_dir, "digest", "Your digest", "News.\n",
                   toml="unsubscribe = true\n")
    jobs = [rig.enqueue(tenant, to=[f"r{i}@example.com"], template="digest") for i in range(2)]
    await rig.start()
    await rig.settle(*jobs)
    assert [m.message["List-Unsubscribe"] for m in sink.handler.received] == [None, None]
    assert [r["status"] for job in jobs for r in rig.log(job)] == ["sent", "sent"]
    warned = [r for r in caplog.records
              if "postrelay.email.bulk_without_unsubscribe_link" in r.getMessage()]
    assert len(warned) == 1 and "template=digest" in warned[0].getMessage()
