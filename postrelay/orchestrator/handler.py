"""The `email_send` handler: render, send once, and record every outcome.

    registry = email_registry(engine, Templates(path), SmtpPool(config),
                              default_from="Acme <noreply@acme.example>")

One attempt, in order:
1. Parse the addresses strictly (a bad one fails the job permanently, logged `failed`).
2. Render (at run time, so a fixed template and a DLQ retry send the fixed mail) and build
   the MIME message; its Message-ID is derived from the job, the same on every attempt. A
   split route's messages render their event's payload, read then (orchestrator/contexts.py).
3. One read, started for the jobs of a claim together as soon as they are claimed
   (orchestrator/claimed.py), learns what earlier attempts left (orchestrator/attempts.py):
   a `sent` row means the message went out and the job completes without sending again;
   an attempt whose worker died (the job's claim is the record that its message may have
   left) is logged `unknown`, and the template's policy decides: resend (the default) or
   hold the job in the DLQ for an operator. Suppressed recipients (in every category or
   in the message's) are left out; when none is left, nothing is sent.
4. Hand the message to the SMTP pool. A 421/454 throttles the email_send kind for every
   worker (queue/throttles.py) before the job is retried as any transient failure is.
   Stopped meanwhile (a timeout, a cancel, a shutdown), or left without the server's answer
   once the message went (the connection dropped, the reply timed out, or said neither yes
   nor no), the attempt is logged `unknown`, and the next one follows the template's
   policy. A server that cannot be used as configured (it speaks only HELO, and STARTTLS or
   AUTH is required) fails the job unsent, logged `failed`.
5. Record the outcome with `record_with_outcome`: it commits in the same transaction as
   the job's next state, so the log and the job never disagree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from email.headerregistry import Address
from typing import Any, NamedTuple
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.errors import ValidationError
from postrelay.core.telemetry import event as log_event
from postrelay.orchestrator import queries
from postrelay.orchestrator.addresses import parse_address, parse_addresses
from postrelay.orchestrator.attempts import SendCheck
from postrelay.orchestrator.claimed import ClaimedJobs, Ready
from postrelay.orchestrator.contexts import EventContexts, shared_key
from postrelay.orchestrator.feedback.unsubscribe import UnsubscribeLinks
from postrelay.orchestrator.feedback.verp import ReturnPath
from postrelay.orchestrator.job import (
    EMAIL_KIND,
    EmailJob,
    check_bulk_recipients,
    check_routed,
)
from postrelay.orchestrator.logrow import LogRow, refusals, suppress_refused
from postrelay.orchestrator.message import (
    build_message,
    check_header_lines,
    envelope_recipients,
    message_id_domain,
    message_id_for,
)
from postrelay.orchestrator.replies import (
    SmtpAnswerLost,
    SmtpAuthFailed,
    SmtpConfigError,
    SmtpError,
    SmtpPaused,
    SmtpPermanent,
    SmtpThrottled,
)
from postrelay.orchestrator.sending import SendCheckBatcher
from postrelay.orchestrator.templates import TemplateError, Templates
from postrelay.orchestrator.transport import SendProgress, SmtpPool
from postrelay.queue import (
    Job,
    PermanentError,
    Registry,
    Snooze,
    ThrottlePolicy,
    throttle_refused,
)

TENANT_CACHE_SECS = 60.0
DEFAULT_TIMEOUT_SECS = 120.0  # rendering plus one SMTP transaction


def email_registry(
    engine: AsyncEngine,
    templates: Templates,
    pool: SmtpPool,
    *,
    default_from: str | None = None,
    message_id_domain: str | None = None,
    timeout_secs: float = DEFAULT_TIMEOUT_SECS,
    return_path: ReturnPath | None = None,
    unsubscribe: UnsubscribeLinks | None = None,
    throttle: ThrottlePolicy | None = None,
    concurrency: int = 10,
) -> Registry:
    """A Registry with the `email_send` handler, to merge into the worker's. With a
    `return_path`, each message's envelope sender is its signed VERP address. A 421/454
    throttles sending for every worker by `throttle` (default: ThrottlePolicy()).
    `concurrency` is the worker's (orchestrator/sending.py)."""
    registry = Registry()
    sender = EmailSender(engine, templates, pool, default_from=default_from,
                         message_id_domain=message_id_domain, return_path=return_path,
                         unsubscribe=unsubscribe, throttle=throttle, concurrency=concurrency)
    registry.register(EMAIL_KIND, sender.send, timeout=timeout_secs,
                      on_claim=sender.claimed)
    registry.closers.append(sender.close)
    return registry


class EmailSender:
    def __init__(
        self,
        engine: AsyncEngine,
        templates: Templates,
        pool: SmtpPool,
        *,
        default_from: str | None,
        message_id_domain: str | None,
        return_path: ReturnPath | None = None,
        unsubscribe: UnsubscribeLinks | None = None,
        throttle: ThrottlePolicy | None = None,
        concurrency: int = 10,
    ) -> None:
        self.engine = engine.execution_options(isolation_level="AUTOCOMMIT")  # reads only
        self._throttle_engine = engine
        self.throttle = throttle or ThrottlePolicy()
        self.checks = SendCheckBatcher(engine, concurrency=concurrency)
        self.claimed_jobs = ClaimedJobs(self.checks, self.parse)
        self.contexts = EventContexts(self.engine)
        self.templates = templates
        self.pool = pool
        self.default_from = default_from
        self.message_id_domain = message_id_domain
        self.return_path = return_path
        self.unsubscribe = unsubscribe
        self._warned_unlinked: set[str] = set()  # bulk templates sent without links, told once
        self._tenants: dict[UUID, tuple[str, float]] = {}  # id -> (name, valid until)
        self._tenant_lookups: dict[UUID, asyncio.Task[str]] = {}  # in flight

    def parse(self, job: Job) -> tuple[_Parsed, list[str]]:
        """What a run needs of the job alone, strictly (raises ValidationError): its payload,
        addresses and Message-ID, and the envelope recipients, lower-cased."""
        spec = EmailJob.from_payload(job.payload)
        check_routed(job.payload)
        sender, to, cc, bcc, reply_to = self._addresses(spec)
        message_id = self._message_id(job, sender)  # a bad Message-ID domain: refused
        envelope = envelope_recipients(to, cc, bcc)
        parsed = _Parsed(spec, sender, to, cc, bcc, reply_to, message_id, envelope)
        return parsed, [r.lower() for r in envelope]

    def claimed(self, jobs: Sequence[Job]) -> None:
        """The claim hook: each job's reads start now, for the claim's jobs together."""
        self.claimed_jobs.claimed(jobs)
        self.contexts.prefetch(key for job in jobs
                               if (key := shared_key(job.tenant_id, job.payload)) is not None)

    async def send(self, job: Job) -> None:
        ready = self.claimed_jobs.take(job)  # made ready at the claim (claimed.py)
        parsed, recipients = (ready.parsed, ready.recipients) if ready else self._parse(job)
        spec, sender, to, cc, bcc, reply_to, message_id, envelope = parsed
        log = LogRow(job, spec)
        log.update(from_address=str(sender), recipients=recipients,
                   to_addresses=[str(a) for a in to], cc_addresses=[str(a) for a in cc],
                   bcc_addresses=[str(a) for a in bcc], message_id=message_id)
        paused = self.pool.paused_for()
        if paused > 0:
            raise Snooze(paused, "SMTP sending is paused after an authentication failure")

        tenant_keys = (await self._tenant_name(job.tenant_id), str(job.tenant_id))
        try:
            context = await self.contexts.of(job.tenant_id, spec)  # a split route's: shared
            rendered = self.templates.render(spec.template, context, tenant_keys=tenant_keys)
            log.update(template_version=rendered.version, subject=rendered.subject)
            bulk = rendered.unsubscribe or spec.unsubscribe
            if bulk:
                check_bulk_recipients(recipients)
                if not spec.category:
                    # Bulk mail's category is what its unsubscribe link names: the
                    # send-time suppression check reads it from the log row.
                    log.update(category=spec.template)
            message = build_message(rendered=rendered, sender=sender, to=to, cc=cc,
                                    reply_to=reply_to, message_id=log.row["message_id"],
                                    headers=self._list_headers(job, spec, bulk, to))
            data = message.as_bytes()
            # Never hand a server a header line it must refuse: its refusal would be
            # recorded as the recipient's (`bounced`), when the input was at fault.
            check_header_lines(data)
        except (TemplateError, ValidationError) as exc:
            # Not sent now; but an earlier attempt may have been (a lost worker's is logged).
            check = await self._check(ready, log.row)
            for attempt in check.lost_attempts(job.id):
                log.record_lost(attempt)
            if check.already_sent:
                return _already_sent(job)
            log.record("failed", error=str(exc))
            raise PermanentError(str(exc)) from None

        check = await self._check(ready, log.row)
        lost = check.lost_attempts(job.id)
        for attempt in lost:
            log.record_lost(attempt)
        if check.already_sent:
            return _already_sent(job)
        if rendered.on_unknown == "hold" and check.unknown_undecided(lost):
            raise PermanentError(
                "the outcome of an earlier attempt is unknown (its worker was lost, or it "
                "was stopped, while handing the message over); held for an operator by the "
                "template's policy: retry the job from the DLQ to send it again")
        # A category's unsubscribes stop the bulk mail of that category: transactional mail
        # (a password reset in the same category, say) carries no link, and stops only for
        # the suppressions of every category (bounces, complaints).
        suppressed = check.suppressed(log.row["category"] if bulk else None)
        results = {r: {"status": "suppressed"} for r in recipients if r in suppressed}
        # RCPT TO as written: a local part may be case-sensitive (RFC 5321 2.4); the log,
        # the results and the suppression list keep addresses lower-cased.
        live = [r for r in envelope if r.lower() not in suppressed]
        if not live:
            log.record("suppressed", recipient_results=results,
                       error="every recipient is on the tenant's suppression list")
            return
        await self._deliver(job, log, sender, live, data, results)

    async def close(self) -> None:
        self.claimed_jobs.clear()
        self.contexts.clear()
        await self.checks.close()

    def _parse(self, job: Job) -> tuple[_Parsed, list[str]]:
        """`parse`, or the job's end: a payload of the wrong shape fails it without a log
        row, bad addresses with a `failed` one."""
        try:
            return self.parse(job)
        except ValidationError as exc:
            try:
                spec = EmailJob.from_payload(job.payload)
            except ValidationError:
                raise PermanentError(f"invalid email_send payload: {exc}") from None
            LogRow(job, spec).record("failed", error=str(exc))
            raise PermanentError(str(exc)) from None

    async def _check(self, ready: Ready[_Parsed] | None, row: dict[str, Any]) -> SendCheck:
        if ready is not None:
            with contextlib.suppress(Exception):  # that read failed: this one reads again
                return await ready.check
        return await self.checks.check(row)

    async def _tenant_name(self, tenant_id: UUID) -> str:
        """The tenant's name, for its template folder; cached (names rarely change).

        One lookup per tenant at a time: a worker that starts with a full queue would
        otherwise send one query per running job, all queueing for pool connections."""
        cached = self._tenants.get(tenant_id)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        lookup = self._tenant_lookups.get(tenant_id)
        if lookup is None:
            lookup = asyncio.create_task(self._load_tenant_name(tenant_id))
            self._tenant_lookups[tenant_id] = lookup
            lookup.add_done_callback(lambda done: self._lookup_done(tenant_id, done))
        # Shielded: a waiter's timeout must not cancel the lookup the others wait for.
        return await asyncio.shield(lookup)

    def _lookup_done(self, tenant_id: UUID, lookup: asyncio.Task[str]) -> None:
        self._tenant_lookups.pop(tenant_id, None)  # a failed lookup is tried again next time
        if not lookup.cancelled():
            lookup.exception()  # retrieved here too, in case every waiter was cancelled

    async def _load_tenant_name(self, tenant_id: UUID) -> str:
        async with self.engine.connect() as conn:
            name = await queries.tenant_name(conn, tenant_id=tenant_id) or ""
        self._tenants[tenant_id] = (name, time.monotonic() + TENANT_CACHE_SECS)
        return name

    async def _deliver(self, job: Job, log: LogRow, sender: Address, live: list[str],
                       data: bytes, results: dict[str, dict[str, Any]]) -> None:
        # MAIL FROM only: bounces come back naming this attempt's log row; From is unchanged.
        envelope_from = (self.return_path.address(UUID(log.row["id"])) if self.return_path
                         else sender.addr_spec)
        progress = SendProgress()
        try:
            delivery = await self.pool.send(envelope_from, live, data, progress)
        except asyncio.CancelledError:
            if not progress.began:
                # Still waiting for a connection or a throttle: nothing reached a server,
                # so the outcome is known, and a template that holds on unknown ones
                # must not wait for an operator over it.
                log.record("deferred", recipient_results=results,
                           error="stopped (a timeout, a cancel or a shutdown) before the "
                                 "message was handed to the SMTP server: not sent")
                raise
            # A timeout, a cancel or a shutdown while the pool had the message: the server
            # may have accepted it, and nothing else would say so.
            log.record("unknown", recipient_results=results,
                       error="stopped while handing the message to the SMTP server (a "
                             "timeout, a cancel or a shutdown): whether it was accepted "
                             "is not known")
            raise
        except SmtpAnswerLost as exc:
            # The message went and the reply did not come back: as unknown as a stop is,
            # so a template that holds on an unknown outcome is not sent twice by a retry.
            results.update(refusals(exc.refused))
            log.record("unknown", recipient_results=results, error=str(exc))
            raise
        except SmtpConfigError as exc:
            # The server cannot be used as the settings say (it speaks only HELO, and they
            # require STARTTLS or AUTH): nothing was sent, and the message was refused by
            # no one. Not attempted, as bad input is; a retry from the DLQ once the settings
            # or the server are fixed sends it.
            log.record("failed", reply=exc.reply, recipient_results=results, error=str(exc))
            raise PermanentError(str(exc)) from None
        except SmtpError as exc:
            results.update(refusals(exc.refused))
            status = "bounced" if isinstance(exc, SmtpPermanent) else "deferred"
            log.record(status, reply=exc.reply, recipient_results=results, error=str(exc))
            suppress_refused(job, log, exc.refused)
            if isinstance(exc, SmtpThrottled):
                await self._throttled(exc)
            if isinstance(exc, SmtpPaused | SmtpAuthFailed):
                # Bad credentials are not this message's fault: wait out the pause unburnt.
                raise Snooze(max(self.pool.paused_for(), 1.0), str(exc)) from None
            if isinstance(exc, SmtpPermanent):
                raise PermanentError(str(exc)) from None
            raise
        except Exception as exc:  # e.g. an OSError outside the SMTP dialogue: retried
            log.record("deferred", recipient_results=results, error=repr(exc))
            raise
        results.update({r.lower(): {"status": "accepted"} for r in delivery.accepted})
        results.update(refusals(delivery.refused))
        partial = any(r["status"] != "accepted" for r in results.values())
        log.record("partial" if partial else "sent", reply=delivery.reply,
                   queue_id=delivery.queue_id, recipient_results=results)
        suppress_refused(job, log, delivery.refused)

    async def _throttled(self, exc: SmtpThrottled) -> None:
        """The SMTP server (one for the installation: settings, not tenants, name it) said
        421/454: slow email_send down for every worker, not only this one's pool."""
        server = f"{self.pool.config.host}:{self.pool.config.port}"
        await throttle_refused(
            self._throttle_engine, self.throttle, kind=EMAIL_KIND, key_path=None, key="",
            tenant_id=None, pause_secs=self.pool.config.throttle_secs,
            reason=f"SMTP {server} said {exc}", actor=f"smtp {server}")

    def _addresses(self, spec: EmailJob) -> tuple[
        Address, tuple[Address, ...], tuple[Address, ...], tuple[Address, ...],
        tuple[Address, ...],
    ]:
        sender_text = spec.sender or self.default_from
        if not sender_text:
            raise ValidationError("from", "no From address: give the route a sender or set "
                                          "POSTRELAY_EMAIL_FROM")
        to = parse_addresses(list(spec.to), field="to")
        if not to:
            raise ValidationError("to", "a message needs at least one recipient")
        return (parse_address(sender_text, field="from"), to,
                parse_addresses(list(spec.cc), field="cc"),
                parse_addresses(list(spec.bcc), field="bcc"),
                parse_addresses(list(spec.reply_to), field="reply_to"))

    def _list_headers(self, job: Job, spec: EmailJob, bulk: bool,
                      to: Sequence[Address]) -> dict[str, str] | None:
        """RFC 8058 one-click unsubscribe for bulk mail (the template's template.toml or the
        route marks it): the link names the tenant, the message's one recipient and the
        category (the route's, else the template's name)."""
        if bulk and self.unsubscribe is None and spec.template not in self._warned_unlinked:
            # Gmail and Yahoo require the link of bulk senders: the operator should know.
            self._warned_unlinked.add(spec.template)
            log_event("postrelay.email.bulk_without_unsubscribe_link", logging.WARNING,
                      template=spec.template, reason="POSTRELAY_PUBLIC_URL or "
                      "POSTRELAY_FEEDBACK_SECRET is unset")
        if not bulk or self.unsubscribe is None or not to:
            return None
        return self.unsubscribe.headers(job.tenant_id, to[0].addr_spec,
                                        spec.category or spec.template)

    def _message_id(self, job: Job, sender: Address) -> str:
        return message_id_for(job.id, message_id_domain(self.message_id_domain, sender))


class _Parsed(NamedTuple):
    spec: EmailJob
    sender: Address
    to: tuple[Address, ...]
    cc: tuple[Address, ...]
    bcc: tuple[Address, ...]
    reply_to: tuple[Address, ...]
    message_id: str
    envelope: list[str]  # RCPT TO, each address once, as written


def _already_sent(job: Job) -> None:
    log_event("postrelay.email.already_sent", logging.INFO, job_id=str(job.id),
              reason="an earlier attempt of this job was accepted; not sending again")
