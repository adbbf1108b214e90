"""Address parsing is strict, and header values cannot carry a line break in any encoding."""

from __future__ import annotations

import string
from collections.abc import Callable
from email.headerregistry import Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postrelay.core.errors import ValidationError
from postrelay.orchestrator.addresses import (
    AddressError,
    _check_addr_spec,
    _check_addr_spec_strictly,
    _check_header_value_strictly,
    check_header_value,
    parse_address,
    parse_addresses,
)


@pytest.mark.parametrize(("value", "name", "spec"), [
    ("user@example.com", "", "user@example.com"),
    ("  user@example.com  ", "", "user@example.com"),
    ("<user@example.com>", "", "user@example.com"),
    ("Ada Lovelace <ada@example.com>", "Ada Lovelace", "ada@example.com"),
    ("Jürgen Müller <j@example.com>", "Jürgen Müller", "j@example.com"),
    ('"Müller, Jürgen" <j@example.com>', "Müller, Jürgen", "j@example.com"),
    ('"Say \\"hi\\"" <a@example.com>', 'Say "hi"', "a@example.com"),
    ('"a<b>" <a@example.com>', "a<b>", "a@example.com"),
    ("=?utf-8?q?J=C3=BCrgen?= <j@example.com>", "Jürgen", "j@example.com"),
    ("User@EXAMPLE.COM", "", "User@example.com"),
    ("a@münchen.de", "", "a@xn--mnchen-3ya.de"),
])
def test_valid_addresses_parse_to_one_normalised_address(value: str, name: str,
                                                         spec: str) -> None:
    address = parse_address(value, field="to")
    assert isinstance(address, Address)
    assert (address.display_name, address.addr_spec) == (name, spec)


@pytest.mark.parametrize("value", [
    "a@example.test", "a@mail.example", "a@example.com", "a@localhost", "a@mail.localhost",
    "a@printer.local", "a@mailhost", "a@x.invalid",
])
def test_special_use_domains_are_left_to_the_smtp_server(value: str) -> None:
    assert parse_address(value, field="to").addr_spec == value


@pytest.mark.parametrize(("value", "hint"), [
    ("user.example.com", "@"),
    ("a@b.com, c@d.com", "one address per string"),
    ("Ada <a@b.com>, Bob <b@c.com>", "one address per string"),
    ("Müller, Jürgen <j@example.com>", "double quotes"),
    ("a@b.com junk", "not a valid email address"),
    ("<a@b.com> junk", "expected"),
    ("Ada <a@b.com", "expected"),
    ("a b@example.com", "not a valid email address"),
    ("a@exa mple.com", "not a valid email address"),
    ("(comment) a@example.com", "not a valid email address"),
    ("a@example.com (comment)", "not a valid email address"),
    ("Ada (x) <a@example.com>", "double quotes"),
    ("team: a@example.com, b@example.com;", ""),
    ("a@b@example.com", ""),
    ("@example.com", "before the @-sign"),
    ("a@", "after the @-sign"),
    ("a@[127.0.0.1]", ""),
    ("jü@example.com", "Internationalized"),
    ("", "empty"),
])
def test_invalid_addresses_are_refused_naming_the_field(value: str, hint: str) -> None:
    with pytest.raises(AddressError) as caught:
        parse_address(value, field="cc[2]")
    assert caught.value.field == "cc[2]"
    assert isinstance(caught.value, ValidationError)
    assert hint in str(caught.value)


@pytest.mark.parametrize("value", [
    "Ada\r\nBcc: victim@example.com <a@example.com>",
    "a@example.com\nBcc: victim@example.com",
    "=?utf-8?q?Ada=0D=0ABcc:_v@example.com?= <a@example.com>",
    "=?utf-8?b?QWRhDQpCY2M6IHZAZXhhbXBsZS5jb20=?= <a@example.com>",
    "Ada%0d%0aBcc:%20v@example.com <a@example.com>",
    "a@example.com%0D%0ABcc:v@example.com",
])
def test_line_breaks_in_addresses_are_refused_raw_and_encoded(value: str) -> None:
    with pytest.raises(AddressError, match="line break"):
        parse_address(value, field="from")


def test_a_single_string_is_one_address_and_never_split_on_commas() -> None:
    assert parse_addresses('"Doe, Jane" <jane@example.com>', field="to") == (
        Address("Doe, Jane", "jane", "example.com"),)
    with pytest.raises(AddressError):
        parse_addresses("a@example.com, b@example.com", field="to")


def test_a_list_gives_one_address_per_item_with_indexed_fields() -> None:
    parsed = parse_addresses(["a@example.com", "Bé <b@example.com>"], field="to")
    assert [a.addr_spec for a in parsed] == ["a@example.com", "b@example.com"]
    with pytest.raises(AddressError) as caught:
        parse_addresses(["a@example.com", "nope"], field="to")
    assert caught.value.field == "to[1]"


@pytest.mark.parametrize("value", [None, "", "  ", []])
def test_nothing_gives_no_addresses(value: str | list[str] | None) -> None:
    assert parse_addresses(value, field="bcc") == ()


@pytest.mark.parametrize("value", [
    "Hello\r\nBcc: v@example.com", "Hello\nX", "Hello\rX", "a\x0bb", "a\x0cb", "a\x85b",
    "a\u2028b", "a\u2029b", "a\x00b",
    "=?utf-8?q?a=0D=0Ab?=", "=?UTF-8?Q?a=0Ab?=", "=?utf-8?b?YQ0KYg==?=", "=?utf-8?b?YQ0KYg?=",
    "=?iso-8859-1?q?a=85b?=", "=?utf-8?q?a=E2=80=A8b?=", "=?utf-16?b?AGEADQAKAGI=?=",
    "a%0d%0ab", "a%0D%0Ab", "a%0ab", "a%250d%250ab", "a%E2%80%A8b",
])
def test_header_values_with_line_breaks_are_refused(value: str) -> None:
    with pytest.raises(ValidationError) as caught:
        check_header_value(value, field="subject")
    assert caught.value.field == "subject"
    assert "must not contain a line break (header injection)" in str(caught.value)


@pytest.mark.parametrize("value", [
    "Your order #42 has shipped", "Grüße aus Köln — «bald»", "100% off", "tab\there",
    "=?utf-8?q?J=C3=BCrgen?=", "",
])
def test_ordinary_header_values_pass_unchanged(value: str) -> None:
    assert check_header_value(value, field="subject") == value


@pytest.mark.parametrize("value", ["J\udcffrgen <j@example.com>", '"\ud800" <j@example.com>'])
def test_an_unpaired_surrogate_in_a_display_name_is_refused_naming_the_field(value: str) -> None:
    """It has no UTF-8 form: the address parsed, and writing the message raised
    UnicodeEncodeError."""
    with pytest.raises(AddressError) as caught:
        parse_address(value, field="from")
    assert caught.value.field == "from" and "surrogate" in caught.value.rule


def test_other_control_characters_are_refused() -> None:
    with pytest.raises(ValidationError, match="control characters"):
        check_header_value("bell\x07", field="headers.X-Foo")


# The shortcuts below must agree with the strict paths on every input: the same result, or
# the same refusal (field and rule).

def _outcome(check: Callable[[], object]) -> object:
    try:
        return check()
    except ValidationError as exc:
        return (type(exc), exc.field, exc.rule)


_LABELS = st.one_of(
    st.sampled_from(["example", "com", "mail", "xn--mnchen-3ya", "xn--bcher-kva", "localhost",
                     "local", "invalid", "test", "123", "a-b", "-ab", "ab-", "x" * 63, "y" * 64,
                     "EXAMPLE", "Ünal", ""]),
    st.text(alphabet="abcXYZ019-_", min_size=0, max_size=12),
)
_DOMAINS = st.lists(_LABELS, min_size=1, max_size=6).map(".".join) | st.sampled_from(
    ["example.com", "mailhost", "example.com.", ".example.com", "a..b", "1.2.3.4", "[1.2.3.4]",
     ".".join(["a" * 60] * 4), ".".join(["b" * 63] * 4)])
_LOCALS = st.one_of(
    st.text(alphabet="abcz09._+-", min_size=0, max_size=70),
    st.text(alphabet="abcXYZ09._+-!#$%&'*/=?^`{|}~\"\\ (),:;<>@[]é", min_size=0, max_size=20),
    st.sampled_from(["postmaster", "Postmaster", "abuse", "ABUSE", "a" * 64, "a" * 65,
                     "first.last", ".a", "a.", "a..b", '"quoted"', "jü"]),
)


@given(local=_LOCALS, domain=_DOMAINS)
@settings(max_examples=3000, deadline=None)
def test_the_addr_spec_shortcut_agrees_with_email_validator(local: str, domain: str) -> None:
    spec = f"{local}@{domain}"
    assert _outcome(lambda: _check_addr_spec(spec, spec, "to[3]")) == _outcome(
        lambda: _check_addr_spec_strictly(spec, spec, "to[3]"))


@given(value=st.one_of(
    st.text(max_size=40),
    st.text(alphabet=string.printable, max_size=40),
    st.text(alphabet="ab =?%qQbB0dDaA_\r\n\t\x00\x07\u2028é", max_size=40),
    st.sampled_from(["=?utf-8?q?a=0D=0Ab?=", "a%0d%0ab", "a%250d%250ab", "100% off",
                     "=?utf-8?b?YQ0KYg==?=", "tab\there", "x" * 200]),
))
@settings(max_examples=3000, deadline=None)
def test_the_header_value_shortcut_agrees_with_the_full_check(value: str) -> None:
    assert _outcome(lambda: check_header_value(value, field="subject")) == _outcome(
        lambda: _check_header_value_strictly(value, "subject"))


def test_a_cached_address_is_the_same_address_and_bad_input_is_refused_every_time() -> None:
    first = parse_address("Shop <shop@example.com>", field="from")
    assert parse_address("Shop <shop@example.com>", field="from") is first
    assert parse_address("user@example.com", field="to") == Address("", "user",
                                                                     "example.com")
    for _ in range(3):  # refusals are not cached: the same field and rule each time
        with pytest.raises(AddressError) as caught:
            parse_address("user@exa_mple.com", field="to[1]")
        assert caught.value.field == "to[1]" and "not a valid email address" in caught.value.rule
    # A domain the shortcut has seen still gets email-validator's full check of the whole.
    with pytest.raises(AddressError, match="too long"):
        parse_address("a" * 250 + "@example.com", field="to")
