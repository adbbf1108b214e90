"""The `mailto:` unsubscribe of List-Unsubscribe: mail to `unsubscribe@<bounce domain>` whose
subject carries the signed token the link named.

    report = mailto_unsubscribe(raw, envelope_to, links)   # Feedback, or None

None when the mail is not to that address or its subject holds no token postrelay signed;
the caller then reads it as any other mail (kept `unparsed` for an operator).
"""

from __future__ import annotations

import email
import email.policy
from collections.abc import Sequence
from email.errors import HeaderParseError
from email.header import decode_header, make_header
from email.utils import getaddresses

from postrelay.orchestrator.feedback.model import Feedback
from postrelay.orchestrator.feedback.parse import mail_event_id
from postrelay.orchestrator.feedback.unsubscribe import (
    MAILTO_LOCAL,
    UnsubscribeLinks,
    UnsubscribeTokenError,
)

HEAD_BYTES = 64 * 1024
# An address names the mailbox only if its local part is spelled out: folding and comments
# go between an address's tokens, never inside the one atom `unsubscribe`, and an address
# is never an encoded word. So a header block without it cannot be to the mailbox.
_LOCAL_BYTES = MAILTO_LOCAL.encode("ascii")


def mailto_unsubscribe(raw: bytes, envelope_to: Sequence[str],
                       links: UnsubscribeLinks | None) -> Feedback | None:
    if links is None or links.mailto_address is None:
        return None
    head = raw[:HEAD_BYTES].split(b"\r\n\r\n", 1)[0].split(b"\n\n", 1)[0]
    if _LOCAL_BYTES not in head.lower() and \
            links.mailto_address not in (_bare(a) for a in envelope_to):
        # Most mail to the receiver is a bounce: it is not parsed twice (email's parser
        # costs more here than the outline of a whole DSN does).
        return None
    msg = email.message_from_bytes(head, policy=email.policy.compat32)
    to = [*envelope_to, *(a for _, a in getaddresses(msg.get_all("to", [])))]
    if links.mailto_address not in (_bare(a) for a in to):
        return None
    try:
        subject = str(make_header(decode_header(msg.get("subject") or "")))
    # A broken encoded word (`=?UTF-8?B?dW5zd?=`, which anyone may send) is read as it is.
    except (LookupError, UnicodeDecodeError, ValueError, HeaderParseError):
        subject = str(msg.get("subject") or "")
    for word in reversed(subject.split()):
        try:
            tenant, recipient, category = links.verify(word)
        except UnsubscribeTokenError:
            continue
        # The message's own id, not the token's: every mail of the category offers the
        # same token, and a new message after the suppression was lifted unsubscribes
        # again (while one is in place, record_many leaves the report out).
        return Feedback(kind="unsubscribe", source="mail", recipient=recipient,
                        tenant_id=tenant, category=category, vouched=True,
                        source_event_id=mail_event_id(msg, raw),
                        detail={"format": "mailto", "from": str(msg.get("from") or "")[:300]})
    return None


def _bare(address: str) -> str:
    return address.strip().strip("<>").lower()
