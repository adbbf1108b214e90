"""Email routes: which outbox events become which messages.

    email_route("user.signed_up", template="welcome", to="user.email",
                category="onboarding", priority=50)
    email_route("invoice.issued", template="invoice", to=lambda e: e.payload["billing"],
                bcc="archive@example.com", tenants=[ACME])
    email_route("post.published", template="post", to="reader.email",
                category="newsletter", unsubscribe=True)

Each route is an ordinary relay route (named `email:<template>` unless given a name), so
the relay turns a matching event into `email_send` jobs in the transaction that marks the
event handled, with the idempotency key `outbox:<event>:<route>[:<n>]` naming its delivery
link: a replayed event never makes a second message. Recipients come from a dotted path
into the payload, a literal address (anything with an `@`), or a function of the event.
The template's context is the event's payload, plus `event` (its id, type, aggregate and
time) unless the payload has a key of that name. A route that makes several messages of one
event (split, bulk) does not copy the payload into each: their jobs name the event, whose
payload the worker reads when it sends them (contexts.py).

An event whose payload gives a route no usable recipients (the path is missing, it holds
nothing, or not an address or a list of them; the route's function raised) still gets
that route's job, under the key `unroutable`: it fails at once with the reason in the
email log, and the event's other routes and webhooks go on. A replay of the event after
the route is fixed sends the mail.

`unsubscribe=True` marks the route's mail bulk, as `unsubscribe = true` in a template's
template.toml does: each message carries List-Unsubscribe and List-Unsubscribe-Post (RFC
8058) with a signed token for its recipient and category (the route's `category`, else the
template's name), and an unsubscribe stops that category's bulk mail to that address only. So
a bulk route sends one message per To address (as `split=True` does) and takes no Cc or
Bcc: whoever gets the message can follow its link. The same template sent by an unmarked
route stays transactional, and no unsubscribe stops it, whatever its category.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from uuid import UUID

from postrelay.core.errors import ValidationError
from postrelay.core.limits import MAX_MAX_PAYLOAD_BYTES
from postrelay.orchestrator.addresses import parse_address
from postrelay.orchestrator.contexts import event_context
from postrelay.orchestrator.job import (
    EMAIL_KIND,
    UNROUTABLE,
    EmailJob,
    check_category,
    check_unsubscribe,
    unroutable_payload,
)
from postrelay.orchestrator.templates import check_template_name
from postrelay.queue import validated_job
from postrelay.relay import Event, JobRequest, Route, RouteRegistry, default_routes

Recipients = str | Sequence[str] | Callable[[Event], str | Sequence[str] | None] | None


def email_route(
    event_type: str,
    *,
    template: str,
    to: Recipients,
    cc: Recipients = None,
    bcc: Recipients = None,
    sender: str | None = None,
    reply_to: Recipients = None,
    category: str | None = None,
    unsubscribe: bool = False,
    priority: int = 100,
    max_attempts: int | None = None,
    tenants: Iterable[UUID | str] | None = None,
    split: bool = False,
    name: str | None = None,
    routes: RouteRegistry | None = None,
) -> Route:
    """Register an email route. `split=True` sends one message per To address (each with
    the same Cc/Bcc) instead of one message to all of them; `tenants` limits the route to
    those tenants' events; `unsubscribe=True` marks its mail bulk, one message per address
    (see above)."""
    if not template:
        raise ValidationError("template", "an email route needs a template name")
    if to is None:
        raise ValidationError("to", "an email route needs recipients")
    check_category(category)
    check_unsubscribe(unsubscribe, category)
    for field, given in (("cc", cc), ("bcc", bcc)):
        if unsubscribe and given is not None:
            raise ValidationError(field, "a bulk route (unsubscribe=True) sends each address "
                                         "its own message: its link names who unsubscribes")
    only = _check_options(template, sender, priority, max_attempts, tenants, split,
                          {"to": to, "cc": cc, "bcc": bcc, "reply_to": reply_to})

    def route(event: Event) -> list[JobRequest]:
        if only is not None and event.tenant_id not in only:
            return []
        try:
            recipients = _resolve(to, event, "to")
            if not recipients:
                raise ValidationError("to", f"event {event.id} names no recipient for "
                                            f"{template!r}")
            common = {
                "cc": _resolve(cc, event, "cc"), "bcc": _resolve(bcc, event, "bcc"),
                "reply_to": _resolve(reply_to, event, "reply_to"),
            }
        except ValidationError as exc:
            # Raised here, the event was retried until dead, and its webhooks and other
            # routes' jobs with it. Its message fails by itself instead, with the reason in
            # the email log (the handler reads it). Under a key of its own: once the route
            # is fixed, a replay of the event makes the real message.
            return [JobRequest(
                EMAIL_KIND, unroutable_payload(EmailJob(
                    template=template, to=(), context=template_context(event), sender=sender,
                    category=category, event_id=event.id, unsubscribe=unsubscribe), exc),
                priority=priority, max_attempts=max_attempts, key=UNROUTABLE)]
        # Parsed only where each address may get a message of its own: every event passes here.
        unique = _each_mailbox_once(recipients) if split or unsubscribe else []
        # Bulk mail to one address keeps the key it had before bulk routes split.
        one_each = split or (unsubscribe and len(unique) > 1)
        groups = [(str(n), (addr,)) for n, addr in unique] if one_each else [
            (None, recipients)]
        # Several messages of one event share its payload, read when each is sent: a copy
        # in each job made the jobs of a list of n recipients hold n copies of that list.
        shared = len(groups) > 1
        context = {} if shared else template_context(event)
        return [
            JobRequest(
                EMAIL_KIND,
                EmailJob(template=template, to=group, context=context, sender=sender,
                         category=category, event_id=event.id, unsubscribe=unsubscribe,
                         context_from_event=shared, **common).to_payload(),
                priority=priority,
                max_attempts=max_attempts,
                key=key,
            )
            for key, group in groups
        ]

    return (routes if routes is not None else default_routes).add(
        event_type, route, name=name or f"email:{template}")


def _check_options(template: object, sender: object, priority: object, max_attempts: object,
                   tenants: Iterable[UUID | str] | None, split: object,
                   recipients: dict[str, Recipients]) -> frozenset[UUID] | None:
    """What the route will give every job, checked when it is registered: accepted, a bad
    one failed every matching event at run time (retried until dead, its webhooks with it)
    or every message it made. Returns the tenants as UUIDs (None: every tenant)."""
    check_template_name(template)
    if sender is not None:
        if not isinstance(sender, str):
            raise ValidationError("sender", f"must be an address, not {sender!r}")
        parse_address(sender, field="sender")
    for field, spec in recipients.items():  # literal addresses; paths and functions run later
        literal = [spec] if isinstance(spec, str) and "@" in spec else \
            spec if isinstance(spec, list | tuple) else []
        for i, value in enumerate(literal):
            if not isinstance(value, str):
                raise ValidationError(f"{field}[{i}]", f"must be an address, not {value!r}")
            parse_address(value, field=field if isinstance(spec, str) else f"{field}[{i}]")
    # The relay checks each job a route makes; a stand-in job checks the route's part of
    # it (priority, max_attempts) now, by the same rules. None: the settings' default.
    validated_job(EMAIL_KIND, {}, UUID(int=0), priority, None, None,  # type: ignore[arg-type]
                  1 if max_attempts is None else max_attempts, None,  # type: ignore[arg-type]
                  max_bytes=MAX_MAX_PAYLOAD_BYTES)
    if not isinstance(split, bool):
        raise ValidationError("split", f"must be True or False, not {split!r}")
    if tenants is None:
        return None
    if isinstance(tenants, str | UUID):
        raise ValidationError("tenants", "must be a list of tenant ids, not one id")
    try:
        return frozenset(UUID(str(t)) for t in tenants)
    except (TypeError, ValueError):
        raise ValidationError("tenants", f"must be tenant ids (UUIDs), got {tenants!r}") from None


def template_context(event: Event) -> dict[str, Any]:
    return event_context(event.payload, event_id=event.id, event_type=event.event_type,
                         tenant_id=event.tenant_id, aggregate_type=event.aggregate_type,
                         aggregate_id=event.aggregate_id, created_at=event.created_at)


def _each_mailbox_once(recipients: Sequence[str]) -> list[tuple[int, str]]:
    """(position, address) of each mailbox's first address, compared as the envelope
    compares them (case-insensitively): a list naming one mailbox twice (`Ann@x.example`
    and `ann@x.example`) sent it two messages when each address gets its own. The position
    stays the address's own, since it names the message in its idempotency key."""
    seen: set[str] = set()
    unique = []
    for n, value in enumerate(recipients):
        mailbox = _mailbox(value)
        if mailbox not in seen:
            seen.add(mailbox)
            unique.append((n, value))
    return unique


def _mailbox(value: str) -> str:
    try:
        return parse_address(value, field="to").addr_spec.lower()
    except ValidationError:  # kept as written: its own job fails and logs why
        return value


def _resolve(spec: Recipients, event: Event, field: str) -> tuple[str, ...]:
    if spec is None:
        return ()
    if callable(spec):
        try:
            value: Any = spec(event)
        except Exception as exc:  # a KeyError of `e.payload["billing"]`: the event's data
            raise ValidationError(field, f"the route's function raised "
                                         f"{type(exc).__name__}: {exc}") from exc
    elif isinstance(spec, str):
        value = spec if "@" in spec else _lookup(event.payload, spec, field)
    else:
        value = list(spec)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    # Not a mapping: `to="user"` (for "user.email") read the object's keys as addresses.
    if isinstance(value, Iterable) and not isinstance(value, Mapping) \
            and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ValidationError(field, f"must resolve to an address or a list of addresses, "
                                 f"got {type(value).__name__}")


def _lookup(payload: dict[str, Any], path: str, field: str) -> Any:
    value: Any = payload
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ValidationError(field, f"the event payload has no {path!r}")
        value = value[part]
    return value
