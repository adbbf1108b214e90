"""DSNs made by real MTAs (Postfix 3.7, Exim 4.96, sendmail 8.17, OpenSMTPD 6.8, dma 0.13,
nullmailer 2.2, Courier 1.0; mail/real/README.md says how), replayed byte for byte through
`postrelay inbound` as the MTA delivered them: null sender, to the VERP address it bounced
to. Each lands on the log row it is about, with the kind, status and suppression the rules
give."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest

from postrelay.orchestrator import ReturnPath
from postrelay.orchestrator.feedback import SuppressionPolicy
from postrelay.orchestrator.feedback.inbound import InboundConfig, InboundServer
from tests.feedback.conftest import MAIL, await_inbox_empty, insert_log
from tests.feedback.test_inbound import deliver, free_port

DOMAIN = "bounces.example"
SECRETS = {"postfix-3.7": b"postfix-fixture-secret-0123456789",
           "exim-4.96": b"exim-fixture-secret-0-0123456789",
           "sendmail-8.17": b"sendmail-fixture-secret-012345678",
           "opensmtpd-6.8": b"opensmtpd-fixture-secret-0123456789",
           "dma-0.13": b"dma-fixture-secret-0123456789abcd",
           "nullmailer-2.2": b"nullmailer-fixture-secret-0123456789",
           "courier-1.0": b"courier-fixture-secret-0123456789abc"}


@dataclass(frozen=True)
class Sent:
    """What was sent to make the DSN, and what recording it must do."""

    mta: str
    name: str
    log_id: str
    job_id: str
    recipient: str
    kind: str
    status: str | None
    suppressed: bool
    mail_options: tuple[str, ...] = ()  # MAIL's parameters, when the MTA gave some


CASES = [
    Sent("postfix-3.7", "rejected", "8bc3fb14-8e94-4d2d-853b-cfec362f4864",
         "76cec6de-57ee-4c6e-9e16-a70e8d8ebcba", "ann@rejecting.example",
         "bounced", "5.1.1", True),
    Sent("postfix-3.7", "unknown_user", "6f2cb478-fef8-41cb-a7dd-c3656a5fb374",
         "161e789a-34e8-4819-8fbb-776f2a1dd4d1", "nosuchuser@mx.relay.example",
         "bounced", "5.1.1", True),
    # Sent to an alias (info@) that forwards to a mailbox that refuses (john@): the report's
    # Final-Recipient is john@, its Original-Recipient the address postrelay sent to.
    Sent("postfix-3.7", "forwarded", "6fafd7db-4150-4ccb-bfee-58b0e8a0f2e2",
         "7aa3498e-afa0-4b28-a063-79db5907d50f", "info@forwarding.example",
         "bounced", "5.1.1", True),
    Sent("postfix-3.7", "mailbox_full", "dce6732c-e617-4b94-9fe3-4575a5999fa5",
         "d05a1806-f29a-4726-88ea-382ab34c28da", "full-bob@rejecting.example",
         "soft-bounced", "5.2.2", False),
    Sent("postfix-3.7", "delayed", "aeec0bd5-fd88-4f93-9a89-4a16cd45238b",
         "758c8d1d-0780-4539-90f2-036b788ce780", "later-cat@rejecting.example",
         "delayed", "4.2.0", False),
    Sent("postfix-3.7", "expired", "aeec0bd5-fd88-4f93-9a89-4a16cd45238b",
         "758c8d1d-0780-4539-90f2-036b788ce780", "later-cat@rejecting.example",
         "soft-bounced", "4.2.0", False),
    # The returned message's headers carry UTF-8: an RFC 6533 report (message/global-
    # delivery-status), which Postfix hands only to a server that offers SMTPUTF8.
    Sent("postfix-3.7", "smtputf8", "04b78982-343f-456f-8cd7-ec73aea5a96c",
         "e8c79fd3-0f65-4ee8-9eba-16b3686f9f9d", "eve@rejecting.example",
         "bounced", "5.1.1", True, ("SIZE=2727", "BODY=8BITMIME", "SMTPUTF8")),
    Sent("postfix-3.7", "relayed", "750a4a2e-9a4b-40c0-accd-1a7b50f32b92",
         "0052c697-0d49-41cd-8355-667a7fbf29c6", "dan@bounces.example",
         "delivered", "2.0.0", False),
    Sent("exim-4.96", "rejected", "e33bb256-a8e3-4c40-88f3-06d35791e9ee",
         "7ed79087-6937-46fd-a361-e6f290fd6d6f", "ann@rejecting.example",
         "bounced", "5.1.1", True),
    # Exim says only 5.0.0 ("Unrouteable address"): not proof the mailbox is gone.
    Sent("exim-4.96", "unknown_user", "b286243a-4ddb-40ae-b064-a885ab3f6afa",
         "399c6c46-69e8-4ed2-b101-c3e3ce8b66d9", "nosuchuser@mx.relay.example",
         "bounced", "5.0.0", False),
    Sent("exim-4.96", "mailbox_full", "3a25e41a-fddd-4c80-bb8d-3d0bfd8d407f",
         "898f9e64-60fe-428f-8bef-5360f8826cea", "full-bob@rejecting.example",
         "soft-bounced", "5.2.2", False),
    # 5.0.0 beside the remote's "451 4.2.0 ... retry timeout exceeded": Postfix's 4.2.0.
    Sent("exim-4.96", "expired", "4e9f7eae-4956-4237-abd6-13fe9cc962e2",
         "7c5493af-5a63-4209-b735-dabfd5ba0ffd", "later-cat@rejecting.example",
         "soft-bounced", "4.2.0", False),
    Sent("sendmail-8.17", "rejected", "dcd64ae7-ccff-4020-a23b-dc7f505cf0dd",
         "c9c6bcf4-e161-4eed-88be-9cc709e36e45", "ann@rejecting.example",
         "bounced", "5.1.1", True),
    Sent("sendmail-8.17", "unknown_user", "b8d07626-a741-4a47-929d-84c25700530e",
         "465e3c0c-af5a-4067-90e4-a5c90f82f687", "nosuchuser@mx.relay.example",
         "bounced", "5.1.1", True),
    Sent("sendmail-8.17", "mailbox_full", "4c8a1b3e-8503-4abb-814f-e9a7abf3d75e",
         "1c58c794-bfe4-4b8a-8f09-cda06f59afd8", "full-bob@rejecting.example",
         "soft-bounced", "5.2.2", False),
    # sendmail's own codes beside the remote's "451 4.2.0": 4.3.0 while it retries, 4.4.7
    # (delivery time expired) once it gives up.
    Sent("sendmail-8.17", "delayed", "872c705d-a36a-44e3-ab4b-85a90946c140",
         "547ca5c6-f4d3-44ca-a018-0809ba764a0e", "later-cat@rejecting.example",
         "delayed", "4.3.0", False),
    Sent("sendmail-8.17", "expired", "872c705d-a36a-44e3-ab4b-85a90946c140",
         "547ca5c6-f4d3-44ca-a018-0809ba764a0e", "later-cat@rejecting.example",
         "soft-bounced", "4.4.7", False),
    # `Action: relayed (to non-DSN-aware mailer)`: a comment after the action.
    Sent("sendmail-8.17", "relayed", "83e7ac17-65ec-449f-a709-f2b82e9b626f",
         "e6cc9c99-2c63-495f-9d50-1c7cf29fa1d8", "dan@bounces.example",
         "delivered", "2.0.0", False),
    # OpenSMTPD: multipart/mixed, its delivery-status part only the class (5.0.0, 4.0.0);
    # the code comes from the notice's line for the recipient.
    Sent("opensmtpd-6.8", "rejected", "44cee260-e097-40e3-99d4-8ba5334a3dcc",
         "04074fc3-18b6-4947-be4b-034144327138", "ann@rejecting.example",
         "bounced", "5.1.1", True),
    Sent("opensmtpd-6.8", "mailbox_full", "cba47ff6-16be-4f96-8e9a-9f5001c832c5",
         "75a3046f-db7f-4ba0-9a25-37789d6f0920", "full-bob@rejecting.example",
         "soft-bounced", "5.2.2", False),
    Sent("opensmtpd-6.8", "delayed", "3c99132b-f7e6-4eed-824e-a3c938c50eda",
         "4369272f-60e3-4155-bc89-6101dfa0fd87", "later-cat@rejecting.example",
         "delayed", "4.2.0", False),
    # `Action: delayed` with 4.4.7 (delivery time expired): it gave up.
    Sent("opensmtpd-6.8", "expired", "3c99132b-f7e6-4eed-824e-a3c938c50eda",
         "4369272f-60e3-4155-bc89-6101dfa0fd87", "later-cat@rejecting.example",
         "soft-bounced", "4.4.7", False),
    # dma: a plain-text notice naming the recipient, then the server's reply; after its
    # retries ran out, no code at all: a temporary failure that lasted.
    Sent("dma-0.13", "rejected", "d816bdc4-f80c-4edf-a9ba-c3498d4aa52b",
         "df7b243d-452c-4431-8883-170079ce19ac", "ann@rejecting.example",
         "bounced", "5.1.1", True),
    Sent("dma-0.13", "mailbox_full", "712d63f6-1933-4467-9c16-491dc62132c9",
         "cf451ad6-470f-4143-ac62-54998fa4fd88", "full-bob@rejecting.example",
         "soft-bounced", "5.2.2", False),
    Sent("dma-0.13", "expired", "aa1a0713-0094-4392-bdbc-52059d485380",
         "ef257ba7-94d5-479f-a615-1f2e7104e2cd", "later-cat@rejecting.example",
         "soft-bounced", None, False),
    Sent("nullmailer-2.2", "rejected", "7d733ec8-53ba-46e9-b7a1-b712556ad32b",
         "4fc2b056-d15e-4999-b087-aaf7cb7ab252", "ann@rejecting.example",
         "bounced", "5.1.1", True),
    Sent("nullmailer-2.2", "mailbox_full", "196a2d59-3639-47a3-9cfb-de04fb19ec67",
         "9e607fe9-ce4a-432e-b7c2-6f55a32728e0", "full-bob@rejecting.example",
         "soft-bounced", "5.2.2", False),
    # nullmailer reports only what it gave up on, an expired message as `Action: delayed`.
    Sent("nullmailer-2.2", "expired", "02a257bc-be35-480c-8859-9a5a0e3a6cab",
         "7d9486ba-1ac7-4f87-9d27-5d1a1afba095", "later-cat@rejecting.example",
         "soft-bounced", "4.2.0", False),
    # Courier, as Exim: `Status: 5.0.0`, the remote's code in the Diagnostic-Code.
    Sent("courier-1.0", "rejected", "386d6623-09e4-4e20-9f1a-726b6fe507c8",
         "733e6fc8-6c39-4bb4-9759-3b886a2dd8a1", "ann@rejecting.example",
         "bounced", "5.1.1", True),
    Sent("courier-1.0", "mailbox_full", "60bb44ae-5e84-4568-a5e9-7199be48f851",
         "74865206-ecdf-4f37-b2dd-12baf8d2db28", "full-bob@rejecting.example",
         "soft-bounced", "5.2.2", False),
    # "No such domain." beside only 5.0.0: its words say the domain does not resolve, as
    # Postfix's 5.4.4 does, and the address is suppressed as Postfix's would be.
    Sent("courier-1.0", "no_such_domain", "cacbd7df-f097-4e89-8de0-75d944e0c6c4",
         "8f57cfb5-8554-4e2e-ba14-22f5459d2a9f", "nosuchuser@mx.relay.example",
         "bounced", "5.0.0", True),
    Sent("courier-1.0", "delayed", "2fc9fbbc-301f-48d7-b376-301a10b84420",
         "951d983c-ad42-4fbd-9666-d5e758f1f51a", "later-cat@rejecting.example",
         "delayed", "4.0.0", False),
    Sent("courier-1.0", "expired", "2fc9fbbc-301f-48d7-b376-301a10b84420",
         "951d983c-ad42-4fbd-9666-d5e758f1f51a", "later-cat@rejecting.example",
         "soft-bounced", "4.2.0", False),
    Sent("courier-1.0", "relayed", "19c09288-b24b-49ca-b849-0e0b465ce5af",
         "e054e67b-33fd-4995-9364-9bfee3338126", "dan@bounces.example",
         "delivered", "2.0.0", False),
]


@pytest.mark.parametrize("sent", CASES, ids=lambda s: f"{s.mta}/{s.name}")
async def test_a_real_mtas_dsn_is_recorded_on_its_row(sent, receiver_engine, clean_db, engine,
                                                      tenant, look):
    return_path = ReturnPath(DOMAIN, SECRETS[sent.mta])
    log_id = uuid.UUID(sent.log_id)
    with engine.begin() as conn:
        insert_log(conn, tenant_id=tenant, log_id=log_id, job_id=uuid.UUID(sent.job_id),
                   recipients=(sent.recipient,))
    raw = (MAIL / "real" / sent.mta / f"{sent.name}.eml").read_bytes()
    config = InboundConfig(host="127.0.0.1", port=free_port())
    with InboundServer(receiver_engine, return_path, SuppressionPolicy(), config) as server:
        code, _ = await deliver(server, return_path.address(log_id), raw, sent.mail_options)
        assert code == 250
        await await_inbox_empty(look.engine)

    (row,) = look.feedback()
    assert (row["kind"], row["status"], row["recipient"]) == \
        (sent.kind, sent.status, sent.recipient)
    assert (row["email_log_id"], row["matched_by"]) == (log_id, "verp")
    assert look.log(log_id)["delivery"] == {"complaint": "complained"}.get(sent.kind, sent.kind)
    assert ((sent.recipient, "") in look.suppressed(tenant)) is sent.suppressed
