"""Operator views of the email log (CLI, HTTP API and dashboard)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from postrelay.core import jsontext
from postrelay.core.errors import NotFoundError, ValidationError
from postrelay.core.limits import checked_text
from postrelay.core.timestamps import EARLIEST, LATEST
from postrelay.orchestrator import queries
from postrelay.orchestrator.addresses import stored_form
from postrelay.orchestrator.feedback import queries as feedback_queries
from postrelay.orchestrator.schema import DELIVERY_OUTCOMES, EMAIL_STATUSES

MAX_LIMIT = 1000
# A status filter matches the SMTP outcome or the delivery outcome feedback gave later.
LIST_STATUSES = tuple(dict.fromkeys((*EMAIL_STATUSES, *DELIVERY_OUTCOMES)))


def email_list(
    conn: Connection,
    *,
    tenant_id: UUID | str | None = None,
    recipient: str | None = None,
    status: str | None = None,
    template: str | None = None,
    event_id: UUID | str | None = None,
    job_id: UUID | str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """Log rows created in [since, until), newest first, matching every filter given."""
    if status is not None and status not in LIST_STATUSES:
        raise ValidationError("status", f"must be one of {', '.join(LIST_STATUSES)}")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValidationError("limit", f"must be between 1 and {MAX_LIMIT}")
    if offset < 0:
        raise ValidationError("offset", "must not be negative")
    return queries.email_log_list(
        conn,
        tenant_id=_uuid("tenant", tenant_id),
        recipient=address_filter("recipient", recipient),
        status=status,
        template=checked_text(template, "template") if template else None,
        event_id=_uuid("event", event_id),
        job_id=_uuid("job", job_id),
        since=since,
        until=until,
        limit=limit,
        offset=offset,
    )


def email_story(
    conn: Connection, log_id: UUID | str, *, tenant_id: UUID | str | None = None
) -> dict[str, Any]:
    """One message's whole story: {log, attempts, job, audit, event, feedback}, from one
    query.

    `job` is None once retention has deleted the job, `event` once outbox retention has
    deleted the event; the log rows stay."""
    log = _uuid("id", log_id)
    story = None if log is None else queries.email_story(
        conn, log_id=log, tenant_id=_uuid("tenant", tenant_id))
    if story is None:
        raise NotFoundError(f"no email log row {log_id}")
    # The documents come as columns of their own (email.sql says why), put back in place
    # once the times, which are the records' own fields, are read.
    job_payload, event_payload, event_headers = (
        story.pop(key) for key in ("job_payload", "event_payload", "event_headers"))
    story = {key: _with_times(value) for key, value in story.items()}
    if story["job"] is not None:
        story["job"]["payload"] = job_payload
    if story["event"] is not None:
        story["event"].update(payload=event_payload, headers=event_headers)
    for attempt in story["attempts"]:
        attempt["recipient_results"] = _results_shown(attempt.get("recipient_results"))
    return story


def _results_shown(results: Any) -> dict[str, Any] | None:
    """An attempt's recipient_results, an object of address: outcome. SQL written by hand
    can store any jsonb there, and anything else failed the story where it is read as
    one: it is shown as what it is, under the placeholder key of what cannot be shown."""
    if results is None or isinstance(results, dict):
        return results
    shown = jsontext.encode(results)
    return {jsontext.UNREADABLE_KEY: f"not an object of address: outcome: {shown[:200]}"}


# email_story builds its rows with to_jsonb: times arrive as ISO strings.
_STORY_TIMES = ("created_at", "finished_at", "handled_at", "completed_at", "claimed_at",
                "available_at", "dead_at", "received_at", "delivery_at")


def _with_times(value: Any) -> Any:
    """A record of the story (or a list of them) with its ISO time strings turned back into
    datetimes: its own fields only, not the keys of a document it holds (a payload's
    `created_at: "yesterday"` is the payload's own)."""
    if isinstance(value, list):
        return [_with_times(v) for v in value]
    if isinstance(value, dict):
        return {k: _story_time(v) if k in _STORY_TIMES and isinstance(v, str) else v
                for k, v in value.items()}
    return value


def _story_time(text: str) -> datetime:
    """A timestamptz as to_jsonb writes it. SQL written by hand can store 'infinity' or a
    time past Python's years (after 9999, or BC): read as the latest or earliest datetime,
    as the listings read them (core/timestamps.py)."""
    if text in ("infinity", "-infinity"):
        return LATEST if text == "infinity" else EARLIEST
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return EARLIEST if text.endswith(" BC") else LATEST


def suppression_list(conn: Connection, *, tenant_id: UUID | str | None = None,
                     address: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The suppressed addresses (or one address's suppressions, in each tenant and
    category), newest first, each with its reason, source (smtp, mail, ...) and category
    ('' for every category)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ValidationError("limit", f"must be between 1 and {MAX_LIMIT}")
    return queries.email_suppression_list(
        conn, tenant_id=_uuid("tenant", tenant_id), address=address_filter("address", address),
        limit=limit)


def suppression_remove(conn: Connection, address: str, *, tenant_id: UUID | str,
                       actor: str, category: str = "") -> list[str]:
    """Let `address` receive this tenant's mail again, with an audit row naming `actor`
    and what was lifted. By default the suppression of every category goes (a bounce, a
    complaint, a refusal at send time); the address's unsubscribes from single categories
    stay, since they are its own choice. `category` lifts that unsubscribe instead (the
    address subscribed again). Returns the categories it stays suppressed in ('' for
    every category); raises NotFoundError when there is nothing to lift."""
    tenant = _uuid("tenant", tenant_id)
    if tenant is None:
        raise ValidationError("tenant", "name the tenant whose suppression to lift")
    wanted = address_filter("address", address)
    if not wanted:
        raise ValidationError("address", "name the address whose suppression to lift")
    if category and not category.strip():  # blank is no category: '' would lift them all
        raise ValidationError("category", "must name a category, or be '' for what stops "
                                          "all mail")
    category = checked_text(category.strip(), "category")
    checked_text(actor, "actor")
    lifted, others = feedback_queries.email_suppression_lift(
        conn, tenant_id=tenant, address=wanted, category=category, actor=actor)
    if lifted:
        return others
    what = f"unsubscribed from {category}" if category else "suppressed for all mail"
    still = f"; it is suppressed in {categories_text(others)}" if others else ""
    raise NotFoundError(f"{wanted} is not {what} for tenant {tenant}{still}")


def categories_text(categories: list[str]) -> str:
    """Suppression categories as operators read them: '' is every category."""
    return ", ".join(category or "every category" for category in categories)


def address_filter(field: str, value: str | None) -> str | None:
    """An address to look rows up by, as they are stored (addresses.stored_form: lower
    case, an internationalized domain in IDNA form), or None for none. Checked first: a NUL
    or an unpaired surrogate (a byte of a command line that was not UTF-8) failed in the
    driver, with its words instead of the field's."""
    return stored_form(checked_text(value.strip(), field)) if value else None


def _uuid(field: str, value: UUID | str | None) -> str | None:
    """The id as text; None for no filter. An empty one (`--tenant "$T"` with T unset) is
    refused: taken for no filter, it showed every tenant's rows."""
    if value is None:
        return None
    if value == "":
        raise ValidationError(field, "must be a UUID, not empty")
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        raise ValidationError(field, "must be a UUID") from None
