"""The payload of an `email_send` job: one message, rendered when the job runs.

Addresses are kept as written and parsed strictly by the handler, so an invalid one fails
its job permanently with the reason in the email log, rather than failing the relay batch
that made the job. `enqueue_email` checks them at once instead, for domain code that calls
it directly and wants the error in hand; so does `check_email_payload`, with the same code,
for a payload the HTTP API's service-role key enqueues.

The trust boundary: an `email_send` payload is trusted code's (email routes,
`enqueue_email`). Its `from` becomes the message's From and, unless
POSTRELAY_EMAIL_MESSAGE_ID_DOMAIN is set, the domain of its Message-ID; its `event_id` is
recorded in the email log as written. Tenant keys cannot write such a payload: the HTTP API
and the dashboard refuse the kind to them (queue/reserved.py), and the email story joins
an event only of the log row's own tenant.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, overload
from uuid import UUID

from typing_extensions import deprecated

# The package, not `from postrelay.queue import enqueue`: that name is also the module
# postrelay.queue.enqueue, which the layer contracts would read as a reach-in.
import postrelay.queue as pq
from postrelay.core.dbcall import (
    AnyConnection,
    AsyncAnyConnection,
    SyncConnection,
    is_async_connection,
    warn_async_deprecated,
)
from postrelay.core.errors import ValidationError
from postrelay.orchestrator.addresses import check_header_value, parse_addresses
from postrelay.orchestrator.message import envelope_recipients
from postrelay.orchestrator.templates import check_template_name

EMAIL_KIND = "email_send"
MAX_CATEGORY_BYTES = 100


@dataclass(frozen=True, slots=True)
class EmailJob:
    template: str
    to: tuple[str, ...]
    context: Mapping[str, Any] = field(default_factory=dict)
    cc: tuple[str, ...] = ()
    bcc: tuple[str, ...] = ()
    sender: str | None = None  # None: the POSTRELAY_EMAIL_FROM setting
    reply_to: tuple[str, ...] = ()
    category: str | None = None
    event_id: UUID | None = None
    # Bulk mail: carries a one-click unsubscribe link for its category (the category, else
    # the template's name), whatever its template says.
    unsubscribe: bool = False
    # The context is the event's (`event_id`), read when the message is sent
    # (contexts.py): the messages a route makes from one event share it instead of each
    # carrying a copy. `context` is then empty.
    context_from_event: bool = False

    def to_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "template": self.template, "to": list(self.to), "cc": list(self.cc),
            "bcc": list(self.bcc), "from": self.sender, "reply_to": list(self.reply_to),
            "category": self.category, "context": dict(self.context),
            "event_id": str(self.event_id) if self.event_id else None,
        }
        if self.unsubscribe:  # absent otherwise: the payload jobs had before the flag
            payload["unsubscribe"] = True
        if self.context_from_event:  # likewise
            payload["context_from_event"] = True
        return payload

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> EmailJob:
        """Raises ValidationError naming the field when the payload has the wrong shape."""
        template = payload.get("template")
        if not isinstance(template, str) or not template:
            raise ValidationError("template", "must be a non-empty string")
        context = payload.get("context") or {}
        if not isinstance(context, Mapping):
            raise ValidationError("context", "must be a JSON object")
        sender = payload.get("from")
        if sender is not None and not isinstance(sender, str):
            raise ValidationError("from", "must be a string")
        unsubscribe = payload.get("unsubscribe", False)
        if not isinstance(unsubscribe, bool):
            raise ValidationError("unsubscribe", "must be true or false")
        category = payload.get("category")
        check_category(category)
        shared = payload.get("context_from_event", False)
        if not isinstance(shared, bool):
            raise ValidationError("context_from_event", "must be true or false")
        event_id = _event_id(payload.get("event_id"))
        if shared and event_id is None:
            raise ValidationError("event_id", "names the event whose payload is the context "
                                              "(context_from_event), so it must be given")
        return cls(
            template=template,
            to=_strings(payload, "to"),
            context=context,
            cc=_strings(payload, "cc"),
            bcc=_strings(payload, "bcc"),
            sender=sender,
            reply_to=_strings(payload, "reply_to"),
            category=category,
            event_id=event_id,
            unsubscribe=unsubscribe,
            context_from_event=shared,
        )


UNROUTABLE = "unroutable"  # the payload key of a message its route could not address


def unroutable_payload(message: EmailJob, exc: ValidationError) -> dict[str, Any]:
    """The payload of a message whose route found no usable recipients in its event (a
    missing path, nothing, a value of the wrong type): `check_routed` fails its job with
    the reason, in the email log."""
    return message.to_payload() | {UNROUTABLE: {"field": exc.field, "rule": exc.rule}}


def check_routed(payload: Mapping[str, Any]) -> None:
    """Raise the ValidationError the route met, for a message it could not address."""
    unroutable = payload.get(UNROUTABLE)
    if unroutable is None:
        return
    if not isinstance(unroutable, Mapping):
        raise ValidationError(UNROUTABLE, "the route could not address this message")
    raise ValidationError(str(unroutable.get("field", "to")), str(unroutable.get("rule", "")))


def _event_id(value: object) -> UUID | None:
    """The event a message was made from. Not a UUID, it raised ValueError (or
    AttributeError), which the worker took for a passing failure: the job was retried
    until dead, with no log row, instead of failing once with the reason."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            pass
    raise ValidationError("event_id", f"must be a UUID, not {value!r}")


def _strings(payload: Mapping[str, Any], name: str) -> tuple[str, ...]:
    value = payload.get(name)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ValidationError(name, "must be an address or a list of addresses")


@overload
def enqueue_email(
    conn: SyncConnection, message: EmailJob, *, tenant_id: UUID | str, priority: int = ...,
    delay: float | None = ..., max_attempts: int | None = ...,
    idempotency_key: str | None = ..., created_by: str | None = ...,
) -> UUID: ...
@overload
@deprecated("enqueue_email on an async connection: await enqueue_email_async(conn, ...) instead")
def enqueue_email(
    conn: AsyncAnyConnection, message: EmailJob, *, tenant_id: UUID | str,
    priority: int = ..., delay: float | None = ..., max_attempts: int | None = ...,
    idempotency_key: str | None = ..., created_by: str | None = ...,
) -> Coroutine[Any, Any, UUID]: ...
def enqueue_email(
    conn: AnyConnection,
    message: EmailJob,
    *,
    tenant_id: UUID | str,
    priority: int = 100,
    delay: float | None = None,
    max_attempts: int | None = None,
    idempotency_key: str | None = None,
    created_by: str | None = None,
) -> UUID | Coroutine[Any, Any, UUID]:
    """Enqueue one message in the caller's transaction (never committed here).

    The addresses and headers are checked first, then the payload as `enqueue` checks
    every payload (no NUL, at most POSTRELAY_MAX_PAYLOAD_BYTES, at most 64 levels deep);
    a bad one raises ValidationError naming the field (`to`, `context.name`, `message`
    for the whole), nothing is written and the transaction stays usable. On an async
    connection, `await enqueue_email_async(...)`."""
    if is_async_connection(conn):
        warn_async_deprecated("enqueue_email_async")
        return enqueue_email_async(
            conn, message, tenant_id=tenant_id, priority=priority, delay=delay,
            max_attempts=max_attempts, idempotency_key=idempotency_key, created_by=created_by)
    payload = _checked_payload(message)
    with _named_for_the_message():
        return pq.enqueue(conn, EMAIL_KIND, payload, tenant_id=tenant_id, priority=priority,
                          delay=delay, max_attempts=max_attempts,
                          idempotency_key=idempotency_key, created_by=created_by)


async def enqueue_email_async(
    conn: AsyncAnyConnection,
    message: EmailJob,
    *,
    tenant_id: UUID | str,
    priority: int = 100,
    delay: float | None = None,
    max_attempts: int | None = None,
    idempotency_key: str | None = None,
    created_by: str | None = None,
) -> UUID:
    """`enqueue_email` on an async connection or session."""
    payload = _checked_payload(message)
    with _named_for_the_message():
        return await pq.enqueue_async(
            conn, EMAIL_KIND, payload, tenant_id=tenant_id, priority=priority, delay=delay,
            max_attempts=max_attempts, idempotency_key=idempotency_key, created_by=created_by)


def check_email_payload(payload: Mapping[str, Any]) -> None:
    """Refuse an `email_send` payload written by hand (the HTTP API's service-role key) that
    its first run would fail: read as the handler reads it, then checked as `enqueue_email`
    checks a message. Raises ValidationError naming the payload's field (`to[0]`,
    `template`); writes nothing. The payload-wide rules (size, depth, NUL) stay `enqueue`'s.

        check_email_payload({"template": "welcome", "to": ["ann@example.com"]})
    """
    message = EmailJob.from_payload(payload)
    check_routed(payload)
    _checked_payload(message)


def check_job_payload(kind: str, payload: Mapping[str, Any]) -> None:
    """What a job of `kind` written by hand (the HTTP API, a cron entry, which enqueues its
    payload at every firing) is checked for before it is stored: an `email_send` payload
    as `check_email_payload` checks it, the field named inside the payload (`payload.to[0]`);
    any other kind's payload is its handler's to read."""
    if kind != EMAIL_KIND:
        return
    try:
        check_email_payload(payload)
    except ValidationError as exc:
        raise ValidationError(f"payload.{exc.field}", exc.rule) from None


def _checked_payload(message: EmailJob) -> dict[str, Any]:
    """The message's template name, addresses and headers checked; its payload."""
    message = _as_written(message)
    check_template_name(message.template)  # else its run fails it: `../x` names no folder
    if not message.to:
        raise ValidationError("to", "a message needs at least one recipient")
    for name in ("to", "cc", "bcc", "reply_to"):
        parse_addresses(list(getattr(message, name)), field=name)
    if message.sender is not None:
        parse_addresses([message.sender], field="from")
    check_category(message.category)
    check_unsubscribe(message.unsubscribe, message.category)
    if message.event_id is not None and not isinstance(message.event_id, UUID):
        _event_id(message.event_id)  # a string is fine if it is one
    if message.context_from_event and message.event_id is None:
        raise ValidationError("event_id", "names the event whose payload is the context "
                                          "(context_from_event), so it must be given")
    if message.unsubscribe:
        check_bulk_recipients(envelope_recipients(
            *(parse_addresses(list(getattr(message, name)), field=name)
              for name in ("to", "cc", "bcc"))))
    return message.to_payload()


def _as_written(message: object) -> EmailJob:
    """The message with its fields in the shapes `to_payload` writes, as a payload is read
    (`from_payload`): one address given as a string is one recipient (not its letters), a
    context of None is empty; a field of another shape is refused, naming it."""
    if not isinstance(message, EmailJob):
        raise ValidationError("message", f"must be an EmailJob, got {type(message).__name__}")
    fixed: dict[str, Any] = {}
    for name in ("to", "cc", "bcc", "reply_to"):
        value = getattr(message, name)
        if value is None or isinstance(value, str):
            fixed[name] = () if value is None else (value,)
        elif not isinstance(value, Iterable) or isinstance(value, bytes | Mapping):
            raise ValidationError(name, "must be an address or a list of addresses")
        elif not isinstance(value, tuple):
            fixed[name] = tuple(value)
    if message.context is None:
        fixed["context"] = {}
    elif not isinstance(message.context, Mapping):
        raise ValidationError("context", "must be a JSON object (a mapping), got "
                                         f"{type(message.context).__name__}")
    if message.sender is not None and not isinstance(message.sender, str):
        raise ValidationError("from", "must be a string")
    return replace(message, **fixed) if fixed else message


def check_category(category: object) -> None:
    """A category is a name: bulk mail's unsubscribe link carries it in a header, and the
    suppression list keys on it. A longer one made the link too long for a header line;
    counted in UTF-8 bytes, which the token carries (a hundred emoji are 400)."""
    if category is None:
        return
    if not isinstance(category, str):
        raise ValidationError("category", "must be a string")
    check_header_value(category, field="category")
    if len(category.encode("utf-8", "surrogatepass")) > MAX_CATEGORY_BYTES:
        raise ValidationError("category", f"at most {MAX_CATEGORY_BYTES} bytes as UTF-8 "
                                          f"({MAX_CATEGORY_BYTES} ASCII characters)")


def check_unsubscribe(unsubscribe: object, category: object) -> None:
    """A message marked bulk: the flag is a bool, and the category it names (the token's,
    which one unsubscribe stops) a non-empty string when given."""
    if not isinstance(unsubscribe, bool):
        raise ValidationError("unsubscribe", f"must be True or False, not {unsubscribe!r} "
                                             "(the category to unsubscribe from is the "
                                             "`category`, else the template's name)")
    if unsubscribe and category is not None and (
            not isinstance(category, str) or not category.strip()):
        raise ValidationError("category", "must be a non-empty string when the mail "
                                          "carries an unsubscribe link (it names what one "
                                          "unsubscribe stops)")


def check_bulk_recipients(recipients: Sequence[str]) -> None:
    """Bulk mail goes to one recipient a message: its unsubscribe link names who
    unsubscribes, and any other recipient of the message could follow it."""
    if len(recipients) > 1:
        raise ValidationError("to", f"bulk mail (with an unsubscribe link) goes to one "
                                    f"recipient a message, not {len(recipients)} (to, cc and "
                                    "bcc): its link names who unsubscribes; send one "
                                    "message per recipient")


@contextmanager
def _named_for_the_message() -> Iterator[None]:
    """The payload is this message: a refusal names its field (`context.name`), not
    `payload`."""
    try:
        yield
    except ValidationError as exc:
        if exc.field == "payload" or exc.field.startswith("payload."):
            field = "message" if exc.field == "payload" else exc.field.removeprefix("payload.")
            raise type(exc)(field, exc.rule) from None
        raise
