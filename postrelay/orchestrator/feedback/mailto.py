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
from email.header import decode_header, make_header
from email.utils import getaddresses

from postrelay.orchestrator.feedback.model import Feedback
from postrelay.orchestrator.feedback.unsubscribe import UnsubscribeLinks, UnsubscribeTokenError

HEAD_BYTES = 64 * 1024


def mailto_unsubscribe(raw: bytes, envelope_to: Sequence[str],
                       links: UnsubscribeLinks | None) -> Feedback | None:
    if links is None or links.mailto_address is None:
        return None
    head = raw[:HEAD_BYTES].split(b"\r\n\r\n", 1)[0].split(b"\n\n", 1)[0]
    msg = email.message_from_bytes(head, policy=email.policy.compat32)
    to = [*envelope_to, *(a for _, a in getaddresses(msg.get_all("to", [])))]
    if links.mailto_address not in (a.strip().strip("<>").lower() for a in to):
        return None
    try:
        subject = str(make_header(decode_header(msg.get("subject") or "")))
    except (LookupError, UnicodeDecodeError, ValueError):
        subject = str(msg.get("subject") or "")
    for word in reversed(subject.split()):
        try:
            tenant, recipient, category = links.verify(word)
        except UnsubscribeTokenError:
            continue
        return Feedback(kind="unsubscribe", source="mail", recipient=recipient,
                        tenant_id=tenant, category=category, vouched=True,
                        source_event_id=word,
                        detail={"format": "mailto", "from": str(msg.get("from") or "")[:300]})
    return None
