"""MIME building: headers decode back to what was given, nothing can inject a header."""

from __future__ import annotations

import email
import email.policy
import email.utils
import uuid
from datetime import UTC, datetime, timedelta, timezone
from email.headerregistry import Address
from email.message import EmailMessage

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postrelay.core.errors import ValidationError
from postrelay.orchestrator.addresses import parse_address
from postrelay.orchestrator.message import (
    build_message,
    envelope_recipients,
    message_id_domain,
    message_id_for,
)
from postrelay.orchestrator.templates import Rendered

JOB_ID = uuid.UUID("0b7e3a52-6f1c-4d0e-9a51-5f6c1d2e3f40")
MESSAGE_ID = f"<{JOB_ID}@mail.example.com>"
SENDER = parse_address('"Shop, Köln" <shop@example.com>', field="from")
TO = (parse_address("Jürgen Müller <j@example.com>", field="to"),
      parse_address("ada@example.test", field="to"))


def rendered(subject: str = "Grüße — Ihre Bestellung «42» ist unterwegs",
             text: str = "Hallo Jürgen,\nIhr Paket kommt.\n",
             html: str | None = "<p>Hallo J&uuml;rgen</p>") -> Rendered:
    return Rendered(template="shipped", version="0123456789ab", subject=subject, text=text,
                    html=html, on_unknown="resend")


def build(**overrides: object) -> EmailMessage:
    arguments: dict[str, object] = {"rendered": rendered(), "sender": SENDER, "to": TO,
                                    "message_id": MESSAGE_ID}
    arguments.update(overrides)
    return build_message(**arguments)  # type: ignore[arg-type]


def reparse(message: EmailMessage) -> EmailMessage:
    data = message.as_bytes()
    data.decode("ascii")  # 7-bit on the wire: no SMTPUTF8 or 8BITMIME needed
    assert b"\r\n" in data and b"\n" not in data.replace(b"\r\n", b"")
    return email.message_from_bytes(data, policy=email.policy.default)  # type: ignore[return-value]


def lines(part: EmailMessage) -> str:
    """A text part's content with the wire's CRLF line ends read as newlines."""
    return part.get_content().replace("\r\n", "\n")


def test_headers_decode_back_to_the_original_utf8_strings() -> None:
    cc = (parse_address('"Doe, Jane" <jane@example.com>', field="cc"),)
    reply_to = (parse_address("Kundendienst Ünal <help@example.com>", field="reply_to"),)
    date = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
    parsed = reparse(build(cc=cc, reply_to=reply_to, date=date,
                           headers={"X-Postrelay-Category": "Bestellung über 50 €"}))
    assert parsed["Subject"] == "Grüße — Ihre Bestellung «42» ist unterwegs"
    assert parsed["From"].addresses == (Address("Shop, Köln", "shop", "example.com"),)
    assert parsed["To"].addresses == TO
    assert parsed["Cc"].addresses == cc
    assert parsed["Reply-To"].addresses == reply_to
    assert parsed["Message-ID"] == MESSAGE_ID
    assert parsed["Date"].datetime == date
    assert parsed["MIME-Version"] == "1.0"
    assert parsed["X-Postrelay-Category"] == "Bestellung über 50 €"
    raw = parsed.as_string()
    assert "=?utf-8?" in raw and "Müller" not in raw.split("\n\n")[0]


def test_text_and_html_are_alternatives_in_utf8() -> None:
    parsed = reparse(build())
    assert parsed.get_content_type() == "multipart/alternative"
    parts = [part.get_content_type() for part in parsed.iter_parts()]
    assert parts == ["text/plain", "text/html"]
    assert lines(parsed.get_body(("plain",))) == "Hallo Jürgen,\nIhr Paket kommt.\n"
    assert parsed.get_body(("html",)).get_content().strip() == "<p>Hallo J&uuml;rgen</p>"
    assert all(p.get_content_charset() == "utf-8" for p in parsed.iter_parts())


def test_without_html_the_message_is_a_single_text_part() -> None:
    parsed = reparse(build(rendered=rendered(html=None)))
    assert parsed.get_content_type() == "text/plain"
    assert lines(parsed) == "Hallo Jürgen,\nIhr Paket kommt.\n"


def test_a_long_subject_is_folded_and_still_decodes() -> None:
    subject = "Ä" + " lange Zeile" * 20
    parsed = reparse(build(rendered=rendered(subject=subject)))
    assert parsed["Subject"] == subject
    assert max(len(line) for line in parsed.as_string().splitlines()) <= 78


def test_bcc_is_never_a_header_but_is_in_the_envelope() -> None:
    bcc = [parse_address("audit@example.com", field="bcc")]
    message = build()
    assert "Bcc" not in message and b"audit@" not in message.as_bytes()
    assert envelope_recipients(TO, (), bcc) == [
        "j@example.com", "ada@example.test", "audit@example.com"]
    with pytest.raises(ValidationError, match="cannot be overridden"):
        build(headers={"Bcc": "audit@example.com"})


def test_envelope_recipients_are_deduplicated_case_insensitively_in_order() -> None:
    to = [parse_address("A@Example.com", field="to"), parse_address("b@example.com", field="to")]
    cc = [parse_address("a@example.com", field="cc"), parse_address("c@example.com", field="cc")]
    bcc = [parse_address("B@EXAMPLE.COM", field="bcc")]
    assert envelope_recipients(to, cc, bcc) == ["A@example.com", "b@example.com",
                                                "c@example.com"]


@pytest.mark.parametrize("subject", [
    "Hi\r\nBcc: victim@example.com", "Hi\nthere", "Hi\u2028there",
    "=?utf-8?q?Hi=0D=0ABcc:_v@example.com?=", "=?utf-8?b?SGkNCkJjYzogdkBleGFtcGxlLmNvbQ==?=",
    "Hi%0d%0aBcc:%20v@example.com",
])
def test_a_subject_with_a_line_break_is_refused(subject: str) -> None:
    with pytest.raises(ValidationError) as caught:
        build(rendered=rendered(subject=subject))
    assert caught.value.field == "subject" and "header injection" in str(caught.value)


@pytest.mark.parametrize("value", [
    "x\r\nBcc: v@example.com", "=?utf-8?q?x=0Ay?=", "=?utf-8?b?eA0KeQ==?=", "x%0Ay",
])
def test_an_extra_header_value_with_a_line_break_is_refused(value: str) -> None:
    with pytest.raises(ValidationError) as caught:
        build(headers={"X-Postrelay-Category": value})
    assert caught.value.field == "headers.X-Postrelay-Category"


@pytest.mark.parametrize("name", ["X Foo", "X:Foo", "X-Foo\r\nBcc", "", "Ẍ-Foo"])
def test_extra_header_names_must_be_field_names(name: str) -> None:
    with pytest.raises(ValidationError) as caught:
        build(headers={name: "v"})
    assert caught.value.field == "headers"


@pytest.mark.parametrize("name", ["From", "to", "Subject", "Message-ID", "Content-Type",
                                  "MIME-Version", "Date", "Resent-To"])
def test_extra_headers_cannot_replace_the_structural_ones(name: str) -> None:
    with pytest.raises(ValidationError, match="cannot be overridden"):
        build(headers={name: "x"})


@pytest.mark.parametrize("field", ["display_name", "username"])
def test_hand_built_addresses_with_line_breaks_are_refused(field: str) -> None:
    # Address itself refuses CR and LF; these are the other line breaks.
    parts = {"display_name": "Ada", "username": "ada", "domain": "example.com"}
    parts[field] = parts[field] + "\u2028Bcc"
    with pytest.raises(ValidationError) as caught:
        build(to=[Address(**parts)])
    assert caught.value.field == "to[0]"
    with pytest.raises(ValidationError) as caught:
        build(sender=Address(**parts))
    assert caught.value.field == "from"


def test_message_id_is_deterministic_per_job() -> None:
    assert message_id_for(JOB_ID, "mail.example.com") == MESSAGE_ID
    assert message_id_for(JOB_ID, "mail.example.com") == message_id_for(JOB_ID,
                                                                        "mail.example.com")
    assert message_id_domain(None, SENDER) == "example.com"
    assert message_id_domain("", SENDER) == "example.com"
    assert message_id_domain("mail.example.com", SENDER) == "mail.example.com"
    for domain in ["bad domain", "a\r\nb", "exa<mple>.com", "münchen.de", ""]:
        with pytest.raises(ValidationError):
            message_id_for(JOB_ID, domain)
    for message_id in ["no-brackets@example.com", "<a@b>\r\nBcc: x", "<ab>"]:
        with pytest.raises(ValidationError) as caught:
            build(message_id=message_id)
        assert caught.value.field == "message_id"


def test_date_defaults_to_now_and_must_be_aware() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    assert reparse(build())["Date"].datetime >= before
    tz = timezone(timedelta(hours=2))
    assert reparse(build(date=datetime(2024, 1, 1, 12, tzinfo=tz)))["Date"].datetime == (
        datetime(2024, 1, 1, 10, tzinfo=UTC))
    with pytest.raises(ValidationError, match="timezone"):
        build(date=datetime(2024, 1, 1))


def test_an_all_bcc_message_has_no_to_header() -> None:
    assert "To" not in reparse(build(to=()))


def test_headers_are_written_as_compat32_writes_them():
    """The message policy writes a short ASCII header without compat32's folding machinery:
    the bytes must be what compat32 writes, for any printable value and at every length
    around the line limit (and for what takes the folding path: non-ASCII, long)."""
    import random
    import string

    from postrelay.orchestrator.message import POLICY

    compat32 = email.policy.compat32.clone(linesep="\r\n")
    pick = random.Random(20261130)
    alphabet = string.ascii_letters + string.digits + string.punctuation + " " * 12
    names = ["To", "Subject", "Message-ID", "Content-Type", "X-A-Rather-Long-Header-Name"]
    for _ in range(5000):
        name = pick.choice(names)
        value = "".join(pick.choice(alphabet) for _ in range(pick.randint(0, 100)))
        value = value if pick.random() > 0.05 else value + "ü\t"
        assert POLICY.fold_binary(name, value) == compat32.fold_binary(name, value), value
        assert POLICY.fold(name, value) == compat32.fold(name, value), value
    # A whole multipart message whose headers fit their lines, as compat32 writes it. (Longer
    # or non-ASCII headers build_message folds itself: see the folding tests below.)
    ascii_to = (parse_address("Ann Example <ann@example.com>", field="to"),
                parse_address("ada@example.test", field="to"))
    msg = build_message(rendered=rendered(subject="Your order 42 has shipped"),
                        sender=parse_address('"Shop, Cologne" <shop@example.com>', field="from"),
                        to=ascii_to, message_id=MESSAGE_ID,
                        date=datetime(2026, 11, 30, tzinfo=UTC),
                        headers={"X-Campaign": "winter sale"})
    assert msg.as_bytes() == msg.as_bytes(policy=compat32)


def header_block(message: EmailMessage) -> list[bytes]:
    return message.as_bytes().split(b"\r\n\r\n", 1)[0].split(b"\r\n")


def rfc2047_names(message: EmailMessage, header: str) -> list[tuple[str, str]]:
    """(display name, address) pairs decoded as RFC 2047 6.2 says: whitespace between two
    adjacent encoded-words is dropped. (email.policy.default keeps a space there inside a
    display name, a known CPython quirk; mail readers and email.header follow the RFC.)"""
    from email.header import decode_header, make_header
    from email.utils import getaddresses

    raw = email.message_from_bytes(message.as_bytes(), policy=email.policy.compat32)
    unfolded = [value.replace("\r\n", "") for value in raw.get_all(header, [])]  # RFC 5322 2.2.3
    return [(str(make_header(decode_header(name))), addr)
            for name, addr in getaddresses(unfolded)]


LONG_SUBJECTS = {
    "one ASCII word of 2,000 characters": "A" * 2000,
    "ASCII words, 3,000 characters": " ".join(["shipment"] * 333),
    "ASCII words with a 990-character one": "Order " + "x" * 990 + " shipped",
    "non-ASCII, 1,500 characters": "é" * 1500,
    "non-ASCII words": " ".join(["Grüße"] * 300),
    "emoji and CJK": "😀中文" * 400,
    "right-to-left": "שלום " * 250,
    "mixed, with tabs and double spaces": "Ihre  Bestellung\tüber " + "€" * 200 + " x" * 50,
}


@pytest.mark.parametrize("subject", LONG_SUBJECTS.values(), ids=LONG_SUBJECTS.keys())
def test_a_long_subject_folds_within_the_line_limits_and_decodes_back(subject: str) -> None:
    """Issue 18: a subject compat32 could not fold (a word longer than a line) made a header
    line over RFC 5322's 998 octets, which the server refused as a bounce."""
    message = build(rendered=rendered(subject=subject))
    lines = header_block(message)
    assert max(len(line) for line in lines) <= 998
    # Where the text has words of a normal length, lines keep to the recommended 78.
    if "x" * 990 not in subject:
        assert max(len(line) for line in lines) <= 78, max(lines, key=len)
    assert reparse(message)["Subject"] == subject


LONG_NAMES = {
    "ASCII, one word of 1,200": "B" * 1200,
    "ASCII words": "The Very Long Customer Service Department " * 20,
    "quoted, with specials": "Support, Billing & Accounts (EU) " * 30,
    "non-ASCII": "Jürgen Müller " * 100,
    "non-ASCII, no spaces": "ü" * 700,
}


@pytest.mark.parametrize("name", LONG_NAMES.values(), ids=LONG_NAMES.keys())
def test_long_display_names_fold_within_the_line_limits_and_decode_back(name: str) -> None:
    name = " ".join(name.split())  # as parse_address gives it
    sender = Address(display_name=name, username="shop", domain="example.com")
    to = (Address(display_name=name, username="ann", domain="example.com"),
          Address(display_name="Ada", username="ada", domain="example.test"))
    message = build(sender=sender, to=to)
    assert max(len(line) for line in header_block(message)) <= 78
    assert rfc2047_names(message, "From") == [(name, "shop@example.com")]
    assert rfc2047_names(message, "To") == [(name, "ann@example.com"),
                                            ("Ada", "ada@example.test")]
    parsed = reparse(message)
    assert [a.addr_spec for a in parsed["To"].addresses] == ["ann@example.com",
                                                             "ada@example.test"]


def test_random_headers_always_fold_within_998_and_decode_back() -> None:
    import random
    import string

    pick = random.Random(18)
    alphabets = [string.ascii_letters, string.ascii_letters + " ,;", string.printable[:94]
                 + "  éüß€😀中文שלום"]
    for _ in range(400):
        alphabet = pick.choice(alphabets)
        subject = "".join(pick.choice(alphabet) for _ in range(pick.choice([5, 77, 79, 300,
                                                                            1200, 2500])))
        subject = " ".join(subject.replace("%", "").split(" ")).strip() or "x"
        name = " ".join("".join(pick.choice(alphabet) for _ in range(
            pick.choice([3, 60, 500, 1200]))).replace("%", "").split())
        sender = Address(display_name=name, username="a", domain="example.com")
        message = build(rendered=rendered(subject=subject), sender=sender,
                        to=(sender, Address("", "c", "example.org")))
        assert max(len(line) for line in header_block(message)) <= 998
        assert reparse(message)["Subject"] == subject
        assert rfc2047_names(message, "From") == [(name, "a@example.com")]
        assert rfc2047_names(message, "To") == [(name, "a@example.com"), ("", "c@example.org")]


def test_what_cannot_be_folded_is_refused_naming_the_header() -> None:
    """A header name, a Message-ID and its domain have no place to fold: too long, they are
    refused as bad input before anything is sent."""
    with pytest.raises(ValidationError) as info:
        build(headers={"X-" + "N" * 100: "v"})
    assert info.value.field == "headers" and "76 characters" in info.value.rule
    with pytest.raises(ValidationError) as info:
        message_id_for(JOB_ID, ".".join(["a" * 60] * 5))
    assert info.value.field == "message_id_domain" and "253" in info.value.rule
    with pytest.raises(ValidationError) as info:
        build(message_id=f"<{'x' * 990}@example.com>")
    assert info.value.field == "message_id" and "998" in info.value.rule


def test_check_header_lines_names_the_header_of_a_long_line() -> None:
    from postrelay.orchestrator.message import check_header_lines

    check_header_lines(build().as_bytes())  # a built message always passes
    long = b"From: a@example.com\r\nSubject: x\r\n " + b"y" * 999 + b"\r\n\r\nbody " + b"z" * 2000
    with pytest.raises(ValidationError) as info:
        check_header_lines(long)
    assert info.value.field == "subject" and "998" in info.value.rule


@given(body=st.one_of(st.text(max_size=300),
                      st.text(alphabet="ab =.\t\r\n\u00e9\u20ac", max_size=300),
                      st.text(alphabet="x ", min_size=70, max_size=200)),
       subtype=st.sampled_from(["plain", "html"]))
@settings(max_examples=500, deadline=None)
def test_a_text_part_is_what_the_email_package_builds(body: str, subtype: str) -> None:
    """The part is built without MIMENonMultipart's header parsing: the same bytes."""
    from email.mime.nonmultipart import MIMENonMultipart

    from postrelay.orchestrator.message import POLICY, UTF8, _text_part

    reference = MIMENonMultipart("text", subtype, policy=POLICY)
    reference.set_payload(body, UTF8)
    part = _text_part(body, subtype)
    assert part.as_bytes() == reference.as_bytes()
    assert part.get_payload(decode=True) == reference.get_payload(decode=True)
    assert part.get_content_charset() == "utf-8"


def test_the_sender_header_and_the_date_are_cached_but_what_they_write_is_unchanged() -> None:
    from postrelay.orchestrator.message import _addresses, _date_now, _sender

    for sender in (SENDER, parse_address("Shop <shop@example.com>", field="from"),
                   Address("Support Team " * 8, "help", "example.com")):
        assert _sender(sender) == _addresses("From", [sender], "from")
        assert _sender(sender) == _sender(sender)
    while True:  # what format_datetime writes for now, read twice in the same second
        uncached = email.utils.format_datetime(datetime.now(UTC))
        cached = _date_now()
        if email.utils.format_datetime(datetime.now(UTC)) == uncached:
            break
    assert cached == uncached
    with pytest.raises(ValidationError) as caught:  # a refusal is never cached
        _sender(Address("Ada\u2028Bcc", "ada", "example.com"))
    assert caught.value.field == "from"


@pytest.mark.parametrize(("length", "refused"), [(998, False), (999, True)])
def test_check_header_lines_at_the_limit(length: int, refused: bool) -> None:
    from postrelay.orchestrator.message import check_header_lines

    line = b"Subject: " + b"s" * (length - len(b"Subject: "))
    for head in (line, b"From: a@example.com\r\n" + line, line + b"\r\nTo: b@example.com"):
        data = head + b"\r\n\r\nbody\r\n"
        if refused:
            with pytest.raises(ValidationError, match=f"{length} octets"):
                check_header_lines(data)
        else:
            check_header_lines(data)
    check_header_lines(b"\r\n".join([b"X-A: " + b"a" * 900] * 5) + b"\r\n\r\n")  # short lines
