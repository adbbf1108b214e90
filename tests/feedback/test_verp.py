"""The VERP return path: tokens that name a log row and cannot be forged, the settings that
turn it on, and the real send path putting it in MAIL FROM (From unchanged)."""

from __future__ import annotations

import base64
import binascii
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from postrelay.core.errors import ConfigError
from postrelay.core.settings import load_settings
from postrelay.orchestrator import ReturnPath
from postrelay.orchestrator.feedback import verp
from postrelay.orchestrator.feedback.verp import TokenError

SECRET = b"0123456789abcdef-secret"


def test_an_address_names_its_log_row_whatever_the_case_of_its_local_part():
    path = ReturnPath("Bounces.Acme.Example.", SECRET)
    log_id = uuid.uuid4()
    address = path.address(log_id)
    local, _, domain = address.partition("@")
    assert domain == "bounces.acme.example" and local.startswith("bounce-")
    assert len(local) <= 64 and address.isascii()
    assert path.log_id(address) == log_id
    assert path.log_id(f"<{local.upper()}@BOUNCES.ACME.EXAMPLE>") == log_id


def test_a_tampered_or_foreign_token_is_refused():
    path = ReturnPath("bounces.acme.example", SECRET)
    address = path.address(uuid.uuid4())
    local, _, domain = address.partition("@")
    flipped = local[:20] + ("a" if local[20] != "a" else "b") + local[21:]
    other_secret = ReturnPath("bounces.acme.example", b"another-secret-0123456789")
    for bad, rule in ((f"{flipped}@{domain}", "signature"),
                      (other_secret.address(uuid.uuid4()), "signature"),
                      (f"bounce-{local[7:20]}@{domain}", "length"),
                      (f"bounce-!!!@{domain}", "base32"),
                      (f"postmaster@{domain}", "local part"),
                      (f"{local}@elsewhere.example", "not an address on")):
        with pytest.raises(TokenError, match=rule):
            path.log_id(bad)


def test_a_verified_token_is_remembered_and_a_tampered_one_still_refused():
    path = ReturnPath("bounces.acme.example", b"s" * 32)
    log_id = uuid.uuid4()
    address = path.address(log_id)
    assert path.log_id(address) == path.log_id(address) == log_id  # the second from memory
    local, _, domain = address.partition("@")
    tampered = f"{local[:-1]}{'a' if local[-1] != 'a' else 'b'}@{domain}"
    for _ in range(2):  # a refusal is never remembered as a pass
        with pytest.raises(TokenError):
            path.log_id(tampered)
    other = ReturnPath("bounces.acme.example", b"t" * 32)
    with pytest.raises(TokenError, match="signature"):
        other.log_id(address)  # what one secret verified, another does not take


def test_the_memory_of_verified_tokens_is_bounded_and_forgets_the_oldest(monkeypatch):
    monkeypatch.setattr(verp, "VERIFIED_KEPT", 3)
    path = ReturnPath("bounces.acme.example", b"s" * 32)
    checked: list[str] = []
    verify = path._verify

    def counting(address: str) -> uuid.UUID:
        checked.append(address)
        return verify(address)

    monkeypatch.setattr(path, "_verify", counting)
    a, b, c, d = (path.address(uuid.uuid4()) for _ in range(4))
    for address in (a, b, c, d, b, c, d):
        path.log_id(address)
    assert checked == [a, b, c, d]  # b, c and d from memory
    path.log_id(a)
    assert checked == [a, b, c, d, a]  # the oldest was forgotten to make room


def test_after_a_rotation_tokens_of_the_previous_secret_still_verify():
    """Bounces arrive for days after the mail: while the old secret is kept as the previous
    one, its tokens still name their rows; new tokens are signed with the new secret, and
    a token of any other secret is still refused."""
    old, new = b"old-secret-0123456789", b"new-secret-0123456789"
    before = ReturnPath("bounces.acme.example", old).address(log_id := uuid.uuid4())
    path = ReturnPath("bounces.acme.example", new, previous=old)
    assert path.log_id(before) == log_id
    after = path.address(other := uuid.uuid4())
    assert after != ReturnPath("bounces.acme.example", old).address(other)
    assert ReturnPath("bounces.acme.example", new).log_id(after) == other
    with pytest.raises(TokenError, match="signature"):
        path.log_id(ReturnPath("bounces.acme.example", b"third-secret-0123456789"
                               ).address(uuid.uuid4()))
    with pytest.raises(TokenError, match="signature"):  # once it is dropped, it is refused
        ReturnPath("bounces.acme.example", new).log_id(before)


def test_the_previous_secret_is_read_from_the_settings_and_checked(monkeypatch):
    monkeypatch.setenv("POSTRELAY_EMAIL_BOUNCE_DOMAIN", "bounces.acme.example")
    monkeypatch.setenv("POSTRELAY_FEEDBACK_SECRET_PREVIOUS", "old-secret-0123456789")
    with pytest.raises(ConfigError, match="POSTRELAY_FEEDBACK_SECRET_PREVIOUS: .*needs "
                                          "POSTRELAY_FEEDBACK_SECRET") as refused:
        load_settings()
    assert "old-secret" not in str(refused.value)  # the rule, never the value
    monkeypatch.setenv("POSTRELAY_FEEDBACK_SECRET", "new-secret-0123456789")
    before = ReturnPath("bounces.acme.example", b"old-secret-0123456789").address(
        log_id := uuid.uuid4())
    assert ReturnPath.from_settings(load_settings()).log_id(before) == log_id
    monkeypatch.setenv("POSTRELAY_FEEDBACK_SECRET_PREVIOUS", "short")
    with pytest.raises(ConfigError, match="POSTRELAY_FEEDBACK_SECRET_PREVIOUS: at least 16"):
        ReturnPath.from_settings(load_settings())


def test_the_bounce_domain_needs_a_feedback_secret(monkeypatch):
    monkeypatch.setenv("POSTRELAY_EMAIL_BOUNCE_DOMAIN", "bounces.acme.example")
    with pytest.raises(ConfigError, match="POSTRELAY_FEEDBACK_SECRET"):
        ReturnPath.from_settings(load_settings())
    monkeypatch.setenv("POSTRELAY_FEEDBACK_SECRET", "short")
    with pytest.raises(ConfigError, match="at least 16"):
        ReturnPath.from_settings(load_settings())
    monkeypatch.setenv("POSTRELAY_FEEDBACK_SECRET", SECRET.decode())
    assert ReturnPath.from_settings(load_settings()).domain == "bounces.acme.example"
    monkeypatch.setenv("POSTRELAY_EMAIL_BOUNCE_DOMAIN", "not a domain")
    with pytest.raises(ConfigError, match="POSTRELAY_EMAIL_BOUNCE_DOMAIN"):
        ReturnPath.from_settings(load_settings())
    monkeypatch.delenv("POSTRELAY_EMAIL_BOUNCE_DOMAIN")
    assert ReturnPath.from_settings(load_settings()) is None


async def test_the_envelope_sender_is_the_verp_address_and_from_is_unchanged(
        rig, tenant, sink):
    path = ReturnPath("bounces.acme.example", SECRET)
    job_id = rig.enqueue(tenant, to=["ann@example.com"])
    await rig.start(return_path=path)
    await rig.settle(job_id)
    (row,) = rig.log(job_id)
    (received,) = sink.handler.received
    assert row["status"] == "sent"
    assert received.sender == path.address(row["id"])
    assert path.log_id(received.sender) == row["id"]
    assert received.message["From"] == "Acme <noreply@acme.example>"
    assert row["from_address"] == "Acme <noreply@acme.example>"


async def test_without_a_bounce_domain_the_envelope_sender_is_the_from_address(
        rig, tenant, sink):
    job_id = rig.enqueue(tenant, to=["ann@example.com"])
    await rig.start()
    await rig.settle(job_id)
    (received,) = sink.handler.received
    assert received.sender == "noreply@acme.example"


def test_a_token_has_one_spelling():
    path = ReturnPath("bounces.acme.example", SECRET)
    address = path.address(uuid.uuid4())
    local, _, domain = address.partition("@")
    alphabet = "abcdefghijklmnopqrstuvwxyz234567"
    # The last character carries unused bits: every other spelling of it is refused.
    for ch in alphabet.replace(local[-1], ""):
        with pytest.raises(TokenError):
            path.log_id(f"{local[:-1]}{ch}@{domain}")


BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


@given(st.binary(min_size=verp.TOKEN_BYTES, max_size=verp.TOKEN_BYTES))
def test_a_token_reads_back_the_bytes_base64_wrote(raw):
    assert verp.token_bytes(base64.b32encode(raw).decode().rstrip("=")) == raw


@given(st.text(BASE32, min_size=verp.TOKEN_CHARS, max_size=verp.TOKEN_CHARS)
       | st.text(BASE32 + "az01=! ", max_size=verp.TOKEN_CHARS + 8))
def test_a_token_is_read_only_if_base64_would_have_written_it(token):
    try:
        expected: bytes | None = base64.b32decode(token + "=" * (-len(token) % 8))
    except (binascii.Error, ValueError):
        expected = None
    if expected is not None and (len(expected) != verp.TOKEN_BYTES or
                                 base64.b32encode(expected).decode().rstrip("=") != token):
        expected = None
    try:
        got: bytes | None = verp.token_bytes(token)
    except TokenError:
        got = None
    assert got == expected
