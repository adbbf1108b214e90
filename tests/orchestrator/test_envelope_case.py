"""The envelope keeps each address's local part as written: RFC 5321 2.4 lets a server
treat `John.Smith` and `john.smith` as two mailboxes, and its client MUST preserve the
case. The email log and the suppression list keep lower-cased addresses, to find them."""

from __future__ import annotations


async def test_rcpt_to_keeps_the_local_parts_case(rig, tenant, sink):
    job_id = rig.enqueue(
        tenant,
        to=["John.Smith@Example.com"],
        cc=["Bob@example.com"],
        bcc=["ann@example.com", "JOHN.SMITH@example.com"],
    )
    await rig.start()
    await rig.settle(job_id)

    [received] = sink.handler.received
    # Sent as written (the domain is case-blind, and lower-cased); the second spelling of
    # a mailbox already listed gets no second RCPT.
    assert received.recipients == ("John.Smith@example.com", "Bob@example.com", "ann@example.com")
    [row] = rig.log(job_id)
    assert row["status"] == "sent"
    assert row["recipients"] == ["john.smith@example.com", "bob@example.com", "ann@example.com"]
    assert row["recipient_results"] == {r: {"status": "accepted"} for r in row["recipients"]}


async def test_a_mixed_case_refusal_and_suppression_are_kept_lower_cased(rig, tenant, sink):
    from postrelay.testing import reply

    sink.handler.rules = [("gone@example.com", reply("550 5.1.1 No such user"))]
    job_id = rig.enqueue(tenant, to=["Ann@example.com", "Gone@example.com"])
    await rig.start()
    await rig.settle(job_id)

    [received] = sink.handler.received
    assert received.recipients == ("Ann@example.com",)
    [row] = rig.log(job_id)
    assert row["status"] == "partial"
    assert row["recipient_results"]["ann@example.com"] == {"status": "accepted"}
    assert row["recipient_results"]["gone@example.com"]["status"] == "refused"
    assert set(rig.suppressed(tenant)) == {"gone@example.com"}

    # A later message to that mailbox, in any case, is not sent.
    again = rig.enqueue(tenant, to=["GONE@example.com"])
    await rig.settle(again)
    assert [r["status"] for r in rig.log(again)] == ["suppressed"]
    assert len(sink.handler.received) == 1
