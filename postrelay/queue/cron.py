"""Cron entries: a name, a schedule, a job kind and a payload frozen at creation; each
firing enqueues one job.

Schedules have 5 fields (min hour day month weekday) or 6 (seconds first); a 5-field
schedule is stored with a leading `0` seconds field. Times are UTC. There is no update:
delete the entry and create it again.

    with engine.begin() as conn:
        cron_create(conn, "nightly-cleanup", "0 3 * * *", "bulk_import", {"dryRun": False},
                    tenant_id=tenant)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from croniter import CroniterError, croniter
from sqlalchemy import Connection, Row

from postrelay.core import jsontext
from postrelay.core.errors import ConflictError, NotFoundError, ValidationError
from postrelay.core.limits import checked_text, max_payload_bytes
from postrelay.core.sqlfiles import load_queries
from postrelay.queue.jobspec import INT_MAX, MAX_KIND_CHARS, SMALLINT_MAX, SMALLINT_MIN
from postrelay.queue.reserved import check_cron_name, check_system_kind_tenant

CRON_SQL = load_queries("postrelay.queue", "sql/cron.sql")

SCHEDULE_FORMAT = (
    "expected 5 fields 'minute hour day month weekday' (e.g. '*/5 * * * *') or 6 fields "
    "'second minute hour day month weekday' (e.g. '*/10 * * * * *'), in UTC"
)
MAX_SCHEDULE_CHARS = 1024
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
# croniter's hashed (`H`) and random (`R`) values, as it reads one comma-separated part.
_DRAWN = re.compile(r"^[HR](\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE)
# The six stored fields: name, first and last value, and the names croniter also takes.
_FIELDS = (("second", 0, 59, ()), ("minute", 0, 59, ()), ("hour", 0, 23, ()),
           ("day", 1, 31, ()),
           ("month", 1, 12, ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP",
                             "OCT", "NOV", "DEC")),
           ("weekday", 0, 6, ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")))


@dataclass(frozen=True, slots=True)
class CronEntry:
    id: UUID
    name: str
    tenant_id: UUID
    schedule: str
    kind: str
    payload: dict[str, Any]
    priority: int
    max_attempts: int | None
    last_run: datetime | None
    next_run: datetime | None
    created_at: datetime
    created_by: str | None
    # Its firings fail: since the first of a run of failures, and the latest reason; None
    # once a firing succeeds (queue/maintenance/scheduler.py).
    failing_since: datetime | None = None
    last_error: str | None = None

    @classmethod
    def from_row(cls, row: Row[Any]) -> CronEntry:
        return cls(*tuple(row))


def normalize_schedule(schedule: str) -> str:
    """The stored form of `schedule`: 6 fields, seconds first. Raises ValidationError
    stating the expected format for aliases (@daily) and anything malformed."""
    if not isinstance(schedule, str) or not schedule.strip():
        raise ValidationError("schedule", SCHEDULE_FORMAT)
    # Every worker parses each schedule again every tick: a long one (a list repeated
    # 20,000 times) cost each of them 0.6 s a tick. Every value of every field spelled
    # out takes about 560 characters.
    text = checked_text(schedule.strip(), "schedule", MAX_SCHEDULE_CHARS)
    if text.startswith("@"):
        raise ValidationError("schedule", f"aliases such as {text!r} are not accepted; "
                                          + SCHEDULE_FORMAT)
    fields = text.split()
    if len(fields) == 5:
        fields = ["0", *fields]
    if len(fields) != 6:
        raise ValidationError("schedule", f"{text!r} has {len(text.split())} fields; "
                                          + SCHEDULE_FORMAT)
    _check_fixed(fields)
    normalized = " ".join(fields)
    if not croniter.is_valid(normalized, second_at_beginning=True):
        raise ValidationError("schedule", f"{text!r} is not a valid schedule; " + SCHEDULE_FORMAT)
    for value, field in zip(fields, _FIELDS, strict=True):
        _check_steps(value, *field)
    try:  # valid field by field, yet maybe never due (30 February)
        croniter(normalized, datetime.now(UTC), second_at_beginning=True).get_next(datetime)
    except CroniterError:
        raise ValidationError("schedule", f"{text!r} never fires; " + SCHEDULE_FORMAT) from None
    return normalized


def _check_steps(value: str, name: str, first: int, last: int, names: tuple[str, ...]) -> None:
    """Refuse a step wider than its range. croniter reads `*/99` in the minute field as
    minute 0 alone, so the entry fired hourly where every 99 minutes was written (which no
    cron can do); robfig/cron and Vixie cron likewise check each field's values."""
    for part in value.split(","):
        base, slash, step = part.partition("/")
        if not slash or not step.isdigit():
            continue
        start, dash, end = base.partition("-")
        low: int | None = first
        high: int | None = last
        if base not in ("*", "?"):
            low = _field_value(start, names, first)
            high = _field_value(end, names, first) if dash else last
        if low is None or high is None:
            continue  # a form croniter checked and this reading does not know (L, W)
        # A range may wrap (22-6 hours: 22 to 23, then 0 to 6), as croniter reads it.
        width = high - low if low <= high else high - low + last - first + 1
        if int(step) > max(width, 1):
            raise ValidationError(
                "schedule", f"{part!r} in the {name} field: a step must be at most "
                            f"{max(width, 1)} (the width of {low}-{high}); a larger one "
                            f"selects {low} alone")


def _check_fixed(fields: list[str]) -> None:
    """Refuse croniter's random values (`R`): each reading of the schedule draws another,
    so every scheduler, every round, found another slot due, and `R * * * *` fired dozens
    of times an hour instead of once."""
    for value in fields:
        if any(_DRAWN.fullmatch(part) for part in value.split(",")):
            raise ValidationError("schedule", f"{value!r} is a random value, which cron "
                                              "cannot fire once per slot; " + SCHEDULE_FORMAT)


def _field_value(text: str, names: tuple[str, ...], first: int) -> int | None:
    if text.isdigit():
        return int(text)
    upper = text.upper()
    # The first name is the field's first value: SUN = 0, JAN = 1.
    return names.index(upper) + first if upper in names else None


def slots_between(
    schedule: str, after: datetime, now: datetime
) -> tuple[datetime, datetime] | None:
    """The latest slot in (after, now] and the first slot after now; None if no slot is due.

    Only the latest due slot fires: after downtime a missed slot fires once, not once per
    missed slot.

    Schedules are UTC. croniter reads one in the zone of the times it is given, and the
    database hands timestamptz values over in its session's `timezone` (the host's zone
    on many servers, or the worker's PGTZ): taken as they came, `0 2 * * *` fired at 02:00
    local time, and a DST gap or overlap skipped or repeated slots.
    """
    _check_fixed(schedule.split())  # stored before the rule: its firings fail, listed so
    after, now = after.astimezone(UTC), now.astimezone(UTC)
    first = croniter(schedule, after, second_at_beginning=True).get_next(datetime)
    if first > now:
        return None
    # get_prev is strictly before its start, so start just after now to include now itself.
    latest = croniter(schedule, now + timedelta(microseconds=1), second_at_beginning=True
                      ).get_prev(datetime)
    following = croniter(schedule, now, second_at_beginning=True).get_next(datetime)
    return latest, following


def cron_create(
    conn: Connection,
    name: str,
    schedule: str,
    kind: str,
    payload: Mapping[str, Any],
    *,
    tenant_id: UUID | str,
    priority: int = 100,
    max_attempts: int | None = None,
    created_by: str | None = None,
) -> CronEntry:
    """Create an entry in the caller's transaction. Names are unique per tenant: a name
    this tenant already has raises ConflictError. A name starting `postrelay.` or a system
    kind outside the system tenant raises ForbiddenError (see queue/reserved.py)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValidationError("name", "1-128 characters: letters, digits and . _ : - "
                                      "(starting with a letter or digit)")
    check_cron_name(name)
    stored = normalize_schedule(schedule)
    if not isinstance(kind, str) or not kind:
        raise ValidationError("kind", "must be a non-empty string")
    checked_text(kind, "kind", MAX_KIND_CHARS)
    if not isinstance(payload, Mapping):
        raise ValidationError("payload", "must be a JSON object")
    # Each firing enqueues this payload: the same rules as enqueue's.
    payload_json = jsontext.encode_document(payload, "payload", max_payload_bytes())
    tenant = _uuid_or_none(tenant_id)
    if tenant is None:
        raise ValidationError("tenant_id", "is required")
    check_system_kind_tenant(kind, tenant)
    if isinstance(priority, bool) or not isinstance(priority, int) or not (
        SMALLINT_MIN <= priority <= SMALLINT_MAX
    ):
        raise ValidationError("priority", f"must be an integer between {SMALLINT_MIN} and "
                                          f"{SMALLINT_MAX}")
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= INT_MAX
    ):
        raise ValidationError("max_attempts", f"must be an integer between 1 and {INT_MAX}")
    params = {"name": name, "schedule": stored, "kind": kind, "payload": payload_json,
              "tenant_id": tenant, "priority": priority, "max_attempts": max_attempts,
              "created_by": created_by}
    row = conn.execute(CRON_SQL["cron_insert"], params).first()
    if row is not None:
        return CronEntry.from_row(row)
    tenant_exists, kind_exists, name_taken = conn.execute(
        CRON_SQL["cron_insert_diagnose"], params).one()
    if not tenant_exists:
        raise ValidationError("tenant_id", f"no tenant with id {tenant}")
    if not kind_exists:
        raise ValidationError("kind", f"unknown job kind {kind!r}")
    raise ConflictError(f"a cron entry named {name!r} already exists for this tenant (delete "
                        "it first)")


def cron_list(conn: Connection, *, tenant_id: UUID | str | None = None) -> list[CronEntry]:
    rows = conn.execute(CRON_SQL["cron_list"], {"tenant_id": _uuid_or_none(tenant_id)}).all()
    return [CronEntry.from_row(r) for r in rows]


def cron_delete(
    conn: Connection, name: str, *, tenant_id: UUID | str | None = None, actor: str = "unknown"
) -> None:
    """Delete `tenant_id`'s entry called `name`; it never fires again; an audit row
    (mdm.aa_cron_audit) keeps the entry and who deleted it. An unknown name raises
    NotFoundError. Without `tenant_id`, the name must be one tenant's only (else
    ValidationError asking for the tenant). The built-in `postrelay.*` entries are not
    deleted this way (ForbiddenError)."""
    checked_text(name, "name")  # the name is looked up, not matched against _NAME
    check_cron_name(name)
    tenant = _uuid_or_none(tenant_id)
    if tenant is None:
        owners = conn.execute(CRON_SQL["cron_tenants_named"], {"name": name}).scalars().all()
        if len(owners) > 1:
            raise ValidationError("tenant_id", f"{len(owners)} tenants have a cron entry named "
                                               f"{name!r}: name the tenant")
    deleted = conn.execute(
        CRON_SQL["cron_delete"], {"name": name, "tenant_id": tenant, "actor": actor}
    ).first()
    if deleted is None:
        raise NotFoundError(f"no cron entry named {name!r}")


def _uuid_or_none(value: UUID | str | None) -> UUID | None:
    if value is None or isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise ValidationError("tenant_id", f"must be a UUID, got {value!r}") from None
