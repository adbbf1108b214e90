"""The email log row of one attempt and the suppressions its refusals make, both written
with the job's outcome (`record_with_outcome`: in the transaction of the job's next state)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from postrelay.core.telemetry import event as log_event
from postrelay.orchestrator import queries
from postrelay.orchestrator.attempts import LostAttempt, attempt_log_id
from postrelay.orchestrator.job import EmailJob
from postrelay.orchestrator.replies import Reply, refuses_mailbox, says_passing
from postrelay.queue import Job, RowWriter, record_with_outcome

EMAIL_LOG = RowWriter("email_log", queries.email_log_upsert_many)
LOST_ATTEMPTS = RowWriter("email_log_lost", queries.email_log_add_lost_many)
SUPPRESSIONS = RowWriter("email_suppression", queries.email_suppression_add_many)


class LogRow:
    """The log row of one attempt, recorded with the job's outcome."""

    def __init__(self, job: Job, spec: EmailJob) -> None:
        self.job = job
        self.row: dict[str, Any] = {
            "id": str(attempt_log_id(job.id, job.claimed_at)), "tenant_id": str(job.tenant_id),
            "job_id": str(job.id),
            "event_id": str(spec.event_id) if spec.event_id else None,
            "template": spec.template, "template_version": None, "category": spec.category,
            "from_address": spec.sender or "", "recipients": [r.lower() for r in spec.to],
            "to_addresses": list(spec.to), "cc_addresses": list(spec.cc),
            "bcc_addresses": list(spec.bcc), "subject": None, "message_id": None,
            "attempt": job.attempts,
        }

    def update(self, **values: Any) -> None:
        self.row.update(values)

    def record(self, status: str, *, reply: Reply | None = None, queue_id: str | None = None,
               recipient_results: Mapping[str, Any] | None = None,
               error: str | None = None) -> None:
        row = {**self.row, "status": status, "queue_id": queue_id,
               "recipient_results": dict(recipient_results) if recipient_results else None,
               "error": error}
        # Before the From address is known, the Message-ID's domain is not either.
        row["message_id"] = row["message_id"] or f"<{self.job.id}@unsent.invalid>"
        if reply is not None:
            row.update(smtp_code=reply.code, smtp_enhanced=reply.enhanced,
                       smtp_response=reply.text)
        record_with_outcome(EMAIL_LOG, row)
        # Success is quiet, as a done job is: one INFO line per message would cost a busy
        # worker more than the message's own log row.
        level = logging.DEBUG if status == "sent" else logging.WARNING
        log_event(f"postrelay.email.{status}", level, job_id=str(self.job.id),
                  template=row["template"], attempt=row["attempt"],
                  smtp_code=row.get("smtp_code"), error=error)

    def record_lost(self, lost: LostAttempt) -> None:
        """An earlier attempt of this job whose worker died: `unknown`, under the id that
        attempt gave its own row."""
        row = {**self.row, "id": str(lost.log_id), "attempt": lost.attempt,
               "created_at": lost.rescued_at.isoformat(),
               "error": "the worker sending this attempt was lost before it recorded the reply"}
        record_with_outcome(LOST_ATTEMPTS, row)
        log_event("postrelay.email.unknown", logging.WARNING, job_id=str(self.job.id),
                  template=row["template"], attempt=lost.attempt, error=row["error"])


def refusals(refused: Mapping[str, Reply]) -> dict[str, dict[str, Any]]:
    return {addr.lower(): {"status": "refused", "code": r.code, "enhanced": r.enhanced,
                           "text": r.text} for addr, r in refused.items()}


def suppress_refused(job: Job, log: LogRow, refused: Mapping[str, Reply]) -> None:
    """A permanent refusal that says the mailbox or domain does not exist stops sending
    there (replies.refuses_mailbox): 5.1.x (not 5.1.0, 5.1.7 or 5.1.8), or a code that names
    no cause with words that say so (`550 User unknown`), unless the reply says the state
    is passing (a full mailbox answered with 5.1.1). A 5.7.x policy block says nothing
    about the address, so it never suppresses."""
    for address, reply in refused.items():
        if reply.code >= 500 and refuses_mailbox(reply.enhanced, reply.text) and \
                not says_passing(reply.text):
            record_with_outcome(SUPPRESSIONS, {
                "tenant_id": str(job.tenant_id), "address": address.lower(),
                "reason": f"{reply.code} {reply.enhanced} {reply.text}".strip(),
                "smtp_code": reply.code, "smtp_enhanced": reply.enhanced,
                "email_log_id": log.row["id"]})
