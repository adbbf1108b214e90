"""A report's outline reads as the whole message does: for every report in the formats real
MTAs and providers send, the same feedback; and what it does not expect is parsed whole."""

from __future__ import annotations

import email
import re
import uuid
from email.policy import compat32
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from postrelay.orchestrator.feedback import parse
from postrelay.orchestrator.feedback.outline import (
    BLANK_TEXT_LINE,
    _fields,
    _parts,
    _split,
    outline,
)
from tests.feedback.conftest import bounce_mail

MAIL = sorted(p.name for p in (Path(__file__).parent / "mail").glob("*.eml"))
MID = "<0b7c6a52-8f7e-4d1a-9a0b-2b1f3c4d5e6f@mail.acme.example>"


def whole(raw, **kwargs):
    """parse_mail reading the message whole, as it did before outlines."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parse, "outline", lambda raw: None)
        return parse.parse_mail(raw, **kwargs)


@pytest.mark.parametrize("name", MAIL)
@pytest.mark.parametrize("envelope", [True, False])
def test_every_fixture_reads_the_same_outlined_or_whole(return_path, name, envelope):
    verp = return_path.address(uuid.uuid4())
    raw = bounce_mail(name, verp=verp, message_id=MID)
    kwargs = {"envelope_to": [verp] if envelope else [], "return_path": return_path}
    assert parse.parse_mail(raw, **kwargs) == whole(raw, **kwargs)


@pytest.mark.parametrize("name", ["postfix_bounce.eml", "m365_ndr.eml", "gmail_bounce.eml",
                                  "yahoo_arf.eml", "postfix_delivered.eml"])
def test_the_reports_are_outlined(return_path, name):
    raw = bounce_mail(name, verp=return_path.address(uuid.uuid4()), message_id=MID)
    assert outline(raw) is not None


def test_a_returned_message_of_any_size_is_read_for_its_headers_alone(return_path):
    verp = return_path.address(uuid.uuid4())
    raw = bounce_mail("postfix_bounce.eml", verp=verp, message_id=MID)
    big = raw.replace(b"Hello Ann, welcome aboard.", b"<p>welcome</p>\r\n" * 20000)
    (report,) = parse.parse_mail(big, return_path=return_path)
    assert (report.kind, report.message_id) == ("bounced", MID)
    assert [report] == whole(big, return_path=return_path)


@pytest.mark.parametrize("change", [
    (b"Content-Type: message/delivery-status",
     b"Content-Type: message/delivery-status\r\nContent-Transfer-Encoding: base64"),
    (b"--3F2A1B2C3D.1764625201/mx.example.net--", b""),  # no closing delimiter
    (b'boundary="3F2A1B2C3D.1764625201/mx.example.net"', b""),  # no boundary
    (b"report-type=delivery-status", b"report-type=disposition-notification"),
])
def test_what_it_does_not_expect_is_left_to_the_whole_parse(return_path, change):
    raw = bounce_mail("postfix_bounce.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID).replace(*change)
    assert outline(raw) is None


def test_truncated_or_odd_reports_still_read_the_same(return_path):
    raw = bounce_mail("postfix_bounce.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID)
    for cut in (raw.index(b"Action: failed"), raw.index(b"Return-Path: <bounce"), len(raw) - 10):
        assert parse.parse_mail(raw[:cut], return_path=return_path) == whole(
            raw[:cut], return_path=return_path)
    lf = raw.replace(b"\r\n", b"\n")
    assert parse.parse_mail(lf, return_path=return_path) == whole(lf, return_path=return_path)


_NAME = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":"),
                min_size=1, max_size=12)
_VALUE = st.text(st.sampled_from("ab <>@;:=\t "), max_size=20)
_END = st.sampled_from(["\r\n", "\n"])


@st.composite
def _header_block(draw):
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        lines.append(f"{draw(_NAME)}:{draw(_VALUE)}{draw(_END)}")
        for _ in range(draw(st.integers(0, 2))):  # continuation lines
            lines.append(f"{draw(st.sampled_from([' ', chr(9)]))}{draw(_VALUE)}{draw(_END)}")
    return "".join(lines)


@given(_header_block())
def test_a_header_block_reads_as_emails_parser_reads_it(block):
    ours, theirs = _fields(block), email.message_from_string(block, policy=compat32)
    assert ours._headers == theirs._headers
    for name, _ in theirs._headers:  # found through the index, as the scan finds them
        for asked in (name, name.upper(), name.lower()):
            assert ours.get(asked) == theirs.get(asked)
            assert asked in ours
            assert ours.get_params(header=asked) == theirs.get_params(header=asked)
    assert ours.get("x-not-there", "none") == "none" and "x-not-there" not in ours


# Mostly the plain form MTAs write, which the outline reads itself; some of everything
# else, which it leaves to email.
_PARAM_TEXT = st.text(st.sampled_from("aB.-"), min_size=1, max_size=8) | st.text(
    st.sampled_from('ab.-;=" \\<>*\'()\t'), max_size=8)
_PARAM_VALUE = _PARAM_TEXT | _PARAM_TEXT.map(lambda text: f'"{text}"')
_SPACE = st.sampled_from(["", " ", "\n\t", "  "])


@st.composite
def _content_type(draw):
    value = draw(st.sampled_from(["multipart/report", "Text/Plain", "a(b)", "x=y", ""]))
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(["boundary", "Report-Type", "a*", "a*0*", "b.c", ""]))
        value += f"{draw(_SPACE)};{draw(_SPACE)}{name}{draw(_SPACE)}={draw(_SPACE)}"
        value += draw(_PARAM_VALUE)
    return value + draw(st.sampled_from(["", ";", " ", ";\n\t"]))


@given(_content_type())
def test_a_content_types_parameters_read_as_emails_parser_reads_them(value):
    def read(msg):
        return (msg.get_params(), msg.get_boundary(),
                [msg.get_param(name) for name in ("boundary", "report-type", "b.c")])

    block = f"Content-Type: {value}\n"
    ours = _fields(block)
    assert ours is not None
    try:
        theirs = read(email.message_from_string(block, policy=compat32))
    except TypeError:  # email's RFC 2231 reading fails on some names: left to it, as it is
        with pytest.raises(TypeError):
            read(ours)
        return
    assert read(ours) == theirs


@given(st.text(st.sampled_from("\r\n \ta:"), max_size=30))
def test_a_reports_blocks_are_split_at_blank_lines_as_ever(text):
    def blocks(pattern):
        return [block.strip() for block in pattern.split(text) if block.strip()]

    assert blocks(BLANK_TEXT_LINE) == blocks(re.compile(r"\r?\n\s*\r?\n"))


def test_an_outlines_headers_are_read_only(return_path):
    top = outline(bounce_mail("postfix_bounce.eml", verp=return_path.address(uuid.uuid4()),
                              message_id=MID))
    assert top is not None and top.get_param("report-type") == "delivery-status"
    for change in (lambda: top.__setitem__("X-New", "1"), lambda: top.__delitem__("To"),
                   lambda: top.add_header("X-New", "1"),
                   lambda: top.replace_header("Subject", "changed")):
        with pytest.raises(TypeError, match="read-only"):
            change()


@pytest.mark.parametrize("block", ["From someone Tue Dec  1\n", " leading blank\n",
                                   "Subject: a\nno colon here\n"])
def test_a_block_with_a_line_that_is_no_field_is_not_outlined(block):
    assert _fields(block) is None


# RFC 2046 section 5.1.1's delimiter line for the boundary "b.1": at a line's start, `--`
# and the boundary, `--` after it on the closing one, blanks, the line's end.
_DELIMITER = re.compile(rb"^--b\.1(--)?[ \t]*\r?(?:\n|\Z)", re.MULTILINE)
_LINE = st.sampled_from([b"--b.1", b"--b.1--", b"--b.1 \t", b"--b.1--  ", b"x--b.1", b"--b.1x",
                         b"--b.1-", b"--bx1", b"text", b"", b"\r", b" --b.1"])


def _parts_by_pattern(body: bytes) -> list[bytes] | None:
    parts: list[bytes] = []
    start = None
    for found in _DELIMITER.finditer(body):
        if start is not None:
            end = found.start()
            end -= 2 if body[end - 2:end] == b"\r\n" else 1 if body[end - 1:end] == b"\n" else 0
            parts.append(body[start:max(start, end)])
        if found.group(1):
            return parts
        start = found.end()
    return None


@given(st.lists(st.tuples(_LINE, _END.map(str.encode)), max_size=12), st.booleans())
def test_parts_are_split_at_the_delimiter_lines_alone(lines, last_ended):
    body = b"".join(line + end for line, end in lines)
    if lines and not last_ended:
        body = body[:-len(lines[-1][1])]
    assert _parts(body, b"b.1") == _parts_by_pattern(body)


def test_a_report_with_a_boundary_of_its_own_is_outlined(return_path):
    raw = bounce_mail("postfix_bounce.eml", verp=return_path.address(uuid.uuid4()),
                      message_id=MID)
    for boundary in (b"00000042.1764625201/mx.example.net", b"a+b(c)?[d]*.e"):
        own = raw.replace(b"3F2A1B2C3D.1764625201/mx.example.net", boundary)
        assert outline(own) is not None
        assert parse.parse_mail(own, return_path=return_path) == whole(
            own, return_path=return_path)


@given(st.lists(st.sampled_from([b"\r", b"\n", b"a", b" "]), max_size=12))
def test_headers_end_at_the_first_blank_line(pieces):
    data = b"".join(pieces)
    blank = re.search(rb"\r?\n\r?\n", data)
    expected = (data[:blank.start()], data[blank.end():]) if blank else (data, b"")
    assert _split(data) == expected
