"""Bidi override and isolate characters in tenant-supplied values cannot reorder the
dashboard's text (issue 18): every page is rendered with such values in every field a
tenant writes, and its HTML must hold no raw bidi control (each is shown as `[U+202E]`),
right-to-left text must sit in a <bdi> isolate, and no <bdi> may land where markup cannot
go (an attribute value, <title>, <textarea>, <option>)."""

from __future__ import annotations

import re
import unicodedata
from html.parser import HTMLParser
from typing import Any

import pytest

from postrelay.queue import ensure_tenant
from postrelay.queue.cron import cron_create
from tests.dashboard.conftest import PAGES, dead, insert_email, insert_event

# The test's own definitions, independent of the code under test.
BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


class _Rtl:
    @staticmethod
    def search(data: str) -> bool:
        return any(unicodedata.bidirectional(c) in ("R", "AL", "AN") for c in data)


_RTL = _Rtl()
RLO, LRI, PDI, RLM = "\u202e", "\u2066", "\u2069", "\u200f"
HEBREW = "שלום"
SPOOF = f"Acme {RLO}moc.elpmaxe@nimda"  # would read as "Acme admin@example.com"


@pytest.fixture
def spoofed(engine, tenant) -> dict[str, Any]:
    with engine.begin() as conn:
        rtl_tenant = ensure_tenant(conn, f"{HEBREW} {RLO}tenant")
    job = dead(engine, rtl_tenant, idempotency_key=f"order-{RLO}42",
               last_error=f"boom {RLO}dlrow {HEBREW}",
               payload={"name": f"{LRI}x{PDI}", "he": HEBREW})
    with engine.begin() as conn:
        email = insert_email(
            conn, rtl_tenant, job_id=job, from_address=f"{SPOOF} <billing@acme.example>",
            recipients=[f"{HEBREW} <boss@example.com>"], subject=f"Invoice {RLO}gnp.exe {HEBREW}",
            template=f"welcome{LRI}", error=f"failed {RLM}{HEBREW}",
            smtp_response=f"550 \u061c{HEBREW}", status="failed")
        insert_event(conn, rtl_tenant, event_type=f"order.{RLO}placed",
                     aggregate_type="ord\u2068er", last_error=f"{RLO}bad", dead_at="2024-01-01",
                     payload={"note": f"{HEBREW}{RLO}"})
        cron_create(conn, "nightly", "0 3 * * *", "reindex", {"note": f"{RLO}{HEBREW}"},
                    tenant_id=rtl_tenant)
    return {"job": job, "email": email, "tenant": rtl_tenant}


class BidiChecker(HTMLParser):
    """Walks a page: where <bdi> and right-to-left text appear."""

    NO_MARKUP = {"title", "textarea", "option", "script", "style"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.isolated = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and "<bdi" in value:
                self.problems.append(f"<bdi> in the {name}= of <{tag}>: {value[:80]!r}")
        if tag == "bdi":
            self.isolated += 1
            if self.NO_MARKUP & set(self.stack):
                self.problems.append(f"<bdi> inside <{self.stack[-1]}>")
        if tag not in ("input", "meta", "link", "br", "img", "col", "path"):
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.stack:
            while self.stack.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        if "<bdi" in data and self.NO_MARKUP & set(self.stack):
            self.problems.append(f"a <bdi> written as text in <{self.stack[-1]}>")
        if (_RTL.search(data) and "bdi" not in self.stack
                and not self.NO_MARKUP & set(self.stack)):
            self.problems.append(f"right-to-left text not isolated: {data[:80]!r} "
                                 f"in {'/'.join(self.stack[-3:])}")


def check_page(body: str) -> BidiChecker:
    raw = BIDI_CONTROLS.findall(body)
    assert raw == [], f"raw bidi controls in the page: {[hex(ord(c)) for c in raw]}"
    checker = BidiChecker()
    checker.feed(body)
    assert checker.problems == []
    return checker


def test_every_page_neutralises_and_isolates_tenant_values(admin, spoofed):
    job, email = spoofed["job"], spoofed["email"]
    pages = [*PAGES, f"/dashboard/jobs/{job}", f"/dashboard/emails/{email}",
             "/dashboard/jobs?status=dlq", "/dashboard/jobs?status=failed",
             f"/dashboard/jobs?q=order-{RLO}42", f"/dashboard/emails?template=welcome{LRI}",
             f"/dashboard/emails?recipient={HEBREW}&template={RLO}{HEBREW}",
             f"/dashboard/dlq?tenant={spoofed['tenant']}", "/dashboard/cron"]
    seen = {}
    for path in pages:
        response = admin.get(path, follow_redirects=True)  # a search finding one job: its page
        assert response.status_code == 200, (path, response.status_code)
        seen[path] = check_page(response.text)
    # The values were shown (neutralised, visibly) and isolated, not left out.
    story = admin.get(f"/dashboard/emails/{email}").text
    assert "Acme [U+202E]moc.elpmaxe@nimda" in story
    assert "Invoice [U+202E]gnp.exe" in story and "welcome[U+2066]" in story
    assert re.search(r"<bdi>[^<]*שלום", story)  # the subject's Hebrew, isolated
    assert seen[f"/dashboard/emails/{email}"].isolated >= 3
    log = admin.get("/dashboard/emails").text
    assert "Acme [U+202E]moc.elpmaxe@nimda" in log or "[U+202E]gnp.exe" in log
    assert "order-[U+202E]42" in admin.get(f"/dashboard/jobs/{job}").text
    assert "[U+202E]bad" in admin.get("/dashboard/outbox").text
    # A filter's value comes back in its input neutralised, with no markup in it.
    searched = admin.get("/dashboard/emails", params={"template": f"{RLO}{HEBREW}"}).text
    assert f'value="[U+202E]{HEBREW}"' in searched


def test_the_finalize_hook_and_the_text_filter():
    from postrelay.dashboard.filters import finalize
    from postrelay.dashboard.filters import text as plain

    assert finalize("Acme <a@b>") == "Acme <a@b>"  # ASCII: as it is (escaped later)
    assert finalize(f"x{RLO}y") == "x[U+202E]y"
    assert finalize(f"{HEBREW} <a@b>") == f"<bdi>{HEBREW} &lt;a@b&gt;</bdi>"
    assert finalize(f"{RLO}{HEBREW}") == f"<bdi>[U+202E]{HEBREW}</bdi>"
    for control in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c":
        assert not BIDI_CONTROLS.search(finalize(f"a{control}b"))
        assert plain(f"a{control}b") == f"a[U+{ord(control):04X}]b"
    assert plain(f"{HEBREW}") == HEBREW and "<bdi>" not in plain(finalize(HEBREW))
    assert finalize(42) == 42 and finalize(None) is None
