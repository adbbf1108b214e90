"""SendGrid's Event Webhook: signed batches of events, read into `Feedback`.

    verifier = SendgridVerifier(public_key, tolerance_secs=300)  # the key SendGrid shows
    verifier.verify(body, signature, timestamp)  # WebhookAuthError unless SendGrid signed
                                                 # it, within 300 s of this host's clock
    reports, ignored = sendgrid_reports(json.loads(body))

SendGrid signs the timestamp header followed by the raw body with ECDSA (P-256, SHA-256);
the signature and the key travel base64-encoded (the key as DER, or PEM). A timestamp
further from this host's clock than the tolerance, either way, is refused: a signed batch
captured once would otherwise be taken whenever it is replayed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_der_public_key, load_pem_public_key

from postrelay.core.errors import ConfigError, ValidationError
from postrelay.orchestrator.feedback.model import Feedback, bounce_kind
from postrelay.orchestrator.feedback.webhook import (
    WebhookAuthError,
    check_fresh,
    field,
    obj,
    short,
    status_of,
)

SIGNATURE_HEADER = "X-Twilio-Email-Event-Webhook-Signature"
TIMESTAMP_HEADER = "X-Twilio-Email-Event-Webhook-Timestamp"
MAX_EVENTS = 10_000
# SendGrid's timestamp header: whole seconds since 1970 (a fraction taken too).
UNIX_TIME = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?")
TOLERANCE_SETTING = "POSTRELAY_FEEDBACK_SENDGRID_TOLERANCE_SECS"
# What SendGrid appends to the X-Message-Id in sg_message_id: `.filterdrecv-…` (older) or
# `.recvd-…` (current).
SG_SUFFIX = re.compile(r"\.(?:filter|recvd)")
# The events that are feedback; the others (processed, open, click, group_resubscribe)
# are engagement, which postrelay does not keep.
KINDS = {"delivered": "delivered", "deferred": "delayed", "spamreport": "complaint",
         "unsubscribe": "unsubscribe", "group_unsubscribe": "unsubscribe"}
# Why SendGrid dropped a message without sending it: its own suppression lists.
DROPPED = {"bounced address": "bounced", "spam reporting address": "complaint",
           "unsubscribed address": "unsubscribe"}
# A block is the receiver's policy (reputation, content), never the address's fault.
POLICY_STATUS = "5.7.0"
# A bounce (SendGrid's hard bounce, as opposed to a block) without a specific code is about
# the address when SendGrid classifies it so, or gives no classification (its older events,
# and its reference's example); Technical, Content, Reputation and the other classes are
# about the message or the sender.
ADDRESS_CLASSIFICATIONS = (None, "Invalid Address")


class SendgridVerifier:
    def __init__(self, public_key: str, *, tolerance_secs: float) -> None:
        key = _load_key(public_key.strip())
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise ConfigError("POSTRELAY_FEEDBACK_SENDGRID_PUBLIC_KEY: not an ECDSA public key")
        self._key = key
        self.tolerance_secs = tolerance_secs

    def verify(self, body: bytes, signature: str | None, timestamp: str | None, *,
               now: float | None = None) -> None:
        """WebhookAuthError unless SendGrid signed `timestamp` + `body` with the configured
        key, and `timestamp` is within the tolerance of `now` (this host's clock)."""
        if not signature or not timestamp:
            raise WebhookAuthError(f"{SIGNATURE_HEADER} and {TIMESTAMP_HEADER} are required")
        if not UNIX_TIME.fullmatch(timestamp):
            raise WebhookAuthError(f"{TIMESTAMP_HEADER} is not a Unix time in seconds")
        # Before the signature: a replay is refused without the cost of an ECDSA check.
        check_fresh(TIMESTAMP_HEADER, float(timestamp), time.time() if now is None else now,
                    self.tolerance_secs, TOLERANCE_SETTING)
        try:
            raw = base64.b64decode(signature, validate=True)
            self._key.verify(raw, timestamp.encode() + body, ec.ECDSA(hashes.SHA256()))
        except (binascii.Error, ValueError, InvalidSignature):
            raise WebhookAuthError("the signature does not verify with the configured "
                                   "SendGrid public key") from None


def sendgrid_reports(payload: Any) -> tuple[list[Feedback], int]:
    """The feedback in one Event Webhook batch, and how many events were not feedback.
    ValidationError naming the event's index and field for a malformed batch."""
    if not isinstance(payload, list):
        raise ValidationError("body", "must be a JSON array of events")
    if len(payload) > MAX_EVENTS:
        raise ValidationError("body", f"at most {MAX_EVENTS} events")
    reports: list[Feedback] = []
    ignored = 0
    for i, raw in enumerate(payload):
        found = _event(obj(raw, f"[{i}]"), f"[{i}].")
        if found is None:
            ignored += 1
        else:
            reports.append(found)
    return reports, ignored


def _event(event: Mapping[str, Any], where: str) -> Feedback | None:
    name = field(event, "event", str, where)
    if name not in (*KINDS, "bounce", "dropped"):
        return None
    recipient = field(event, "email", str, where)
    # Events from before SendGrid gave each an id (its legacy Marketing Email unsubscribes)
    # still come without one: the event itself names it, so a retry is still one report.
    event_id = field(event, "sg_event_id", str, where, required=False) or _digest(event)
    stamp = field(event, "timestamp", (int, float), where, required=False)
    reason = field(event, "reason", str, where, required=False)
    response = field(event, "response", str, where, required=False)
    given = field(event, "status", str, where, required=False)
    status = status_of(reason, response, given)
    bounce_type = field(event, "type", str, where, required=False)
    if name == "bounce":
        generic = status is None or status.startswith("5.0.")
        if bounce_type == "blocked" and generic:
            status = POLICY_STATUS
        elif generic and event.get("bounce_classification") in ADDRESS_CLASSIFICATIONS:
            status = None  # SendGrid's verdict on the address itself, as a hard bounce
        kind = bounce_kind(status)
    elif name == "dropped":
        verdict = DROPPED.get((reason or "").strip().lower())
        if verdict is None:  # dropped for the message (quota, a bad header): not the address
            kind, status = "bounced", status or "5.0.0"
        else:  # on SendGrid's own list; its generic 5.0.0 is no code of the address
            kind, status = verdict, None
    else:
        kind = KINDS[name]
        status = status if kind == "delayed" else None
    sg_message_id = field(event, "sg_message_id", str, where, required=False)
    smtp_id = field(event, "smtp-id", str, where, required=False)
    try:
        occurred_at = datetime.fromtimestamp(stamp, UTC) if stamp is not None else None
    except (OverflowError, OSError, ValueError) as exc:
        raise ValidationError(f"{where}timestamp", f"not a time: {exc}") from None
    return Feedback(
        kind=kind, source="sendgrid", recipient=recipient, status=status,
        diagnostic=short(reason or response), source_event_id=event_id,
        message_id=smtp_id if smtp_id and "@" in smtp_id else None,
        # The X-Message-Id of SendGrid's 250 reply, before the ".filter…" or ".recvd-…"
        # it appends (an id may hold dots of its own).
        queue_id=SG_SUFFIX.split(sg_message_id, maxsplit=1)[0] if sg_message_id else None,
        occurred_at=occurred_at,
        detail={k: v for k, v in {
            "event": name, "type": bounce_type, "status": given,
            "bounce_classification": short(event.get("bounce_classification")),
            "asm_group_id": event.get("asm_group_id"), "attempt": short(event.get("attempt")),
            "category": event.get("category"), "sg_message_id": sg_message_id,
        }.items() if v is not None})


def _digest(event: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(event, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def _load_key(text: str) -> Any:
    try:
        if text.startswith("-----BEGIN"):
            return load_pem_public_key(text.encode())
        return load_der_public_key(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ConfigError("POSTRELAY_FEEDBACK_SENDGRID_PUBLIC_KEY: not a public key "
                          f"(base64 DER or PEM): {exc}") from None
