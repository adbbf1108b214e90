"""The envelope addresses SmtpPool sends, against a real aiosmtpd server: UTF-8 ones with
SMTPUTF8, plain ones as aiosmtplib would quote them (without its parser), and the rest
through it."""

from __future__ import annotations

from aiosmtplib.email import quote_address
from hypothesis import given, settings
from hypothesis import strategies as st

from postrelay.orchestrator.dialogue import PLAIN_ADDRESS
from tests.orchestrator.smtp_helpers import SENDER, message

ANN = "ann@acme.example"
BOB = "bob@acme.example"


async def test_non_ascii_addresses_use_smtputf8(make_sink, make_pool):
    sink = make_sink()
    pool = make_pool(sink)

    await pool.send(SENDER, ["jürgen@bücher.example"], message())

    assert sink.handler.received[0].recipients == ("jürgen@bücher.example",)


async def test_envelope_addresses_are_sent_as_aiosmtplib_would_quote_them(make_sink, make_pool):
    """Plain addresses skip aiosmtplib's parsing; any other form still goes through it."""
    sink = make_sink()
    pool = make_pool(sink)

    await pool.send("bounce+a1.b-2=x@acme.example", [ANN, "Bob <bob@acme.example>"], message())
    await pool.send("Shop <shop@acme.example>", ["first.last+tag@mail.acme.example"],
                    message())

    received = sink.handler.received
    assert (received[0].sender, received[0].recipients) == (
        "bounce+a1.b-2=x@acme.example", (ANN, BOB))
    assert (received[1].sender, received[1].recipients) == (
        "shop@acme.example", ("first.last+tag@mail.acme.example",))


@given(address=st.one_of(
    st.from_regex(PLAIN_ADDRESS, fullmatch=True),
    st.text(alphabet="aZ09._+=-@ <>\"()[],;:\\é", max_size=30),
))
@settings(max_examples=2000, deadline=None)
def test_a_plain_address_is_what_aiosmtplib_sends_for_it(address: str) -> None:
    if PLAIN_ADDRESS.fullmatch(address):
        assert quote_address(address) == f"<{address}>"
