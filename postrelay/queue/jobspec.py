"""A job as callers describe it, and the rules it must pass before anything is written.

`JobSpec` is one job for `enqueue_many`; `validated_job` checks one job's fields and puts
them in the form the inserts take, raising ValidationError that names the field and the
rule. Everything PostgreSQL would refuse is refused here (core/limits.py), so a refused job
leaves the caller's transaction usable. enqueue.py writes what passes.

    row = validated_job("reindex", {"order": 42}, tenant, 100, None, None, None, None)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from postrelay.core import jsontext
from postrelay.core.clock import utcnow
from postrelay.core.errors import ValidationError
from postrelay.core.limits import MAX_DEPTH, MAX_KEY_CHARS, checked_text, max_payload_bytes
from postrelay.core.settings import environment_settings

SMALLINT_MIN, SMALLINT_MAX = -32768, 32767
INT_MAX = 2**31 - 1
# A delay past this is almost certainly a unit mistake (ms for s), and far past it the
# database's timestamp range ends; refuse it as bad input instead.
MAX_DELAY_SECS = 10 * 365 * 24 * 3600
MAX_KIND_CHARS = 63  # an enum label's limit (NAMEDATALEN - 1)
# The outbox relay's keys, `outbox:<event>:<route>`: kept unique by its delivery links, not
# by job_idempotency_uk (sql/job.sql), so no other writer may use the prefix.
RELAY_KEY_PREFIX = "outbox:"


# A job as validated_job leaves it: kind, payload (JSON text), tenant_id, priority, delay,
# run_at, max_attempts, idempotency_key.
ValidatedJob = dict[str, Any]


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job for `enqueue_many`; the fields mean what `enqueue`'s arguments mean."""

    kind: str
    payload: Mapping[str, Any]
    tenant_id: UUID | str
    priority: int = 100
    delay: float | timedelta | None = None
    run_at: datetime | None = None
    max_attempts: int | None = None
    idempotency_key: str | None = None


def default_max_attempts() -> int:
    """`max_attempts` of a job enqueued without one: the job_max_retries setting
    (POSTRELAY_JOB_MAX_RETRIES, default 8)."""
    return environment_settings().job_max_retries


def run_at_in_reach(run_at: datetime, now: datetime) -> bool:
    """Whether a job may be due at `run_at`: no further ahead than a delay may be, and a
    time UTC can hold (year 1 at +14:00 is a year before it in UTC: PostgreSQL stores it,
    and no reader can load it back, not even the claim that meets it)."""
    try:
        return run_at.astimezone(UTC) - now <= timedelta(seconds=MAX_DELAY_SECS)
    except OverflowError:
        return False


def validated_job(
    kind: str,
    payload: Mapping[str, Any],
    tenant_id: UUID | str,
    priority: int,
    delay: float | timedelta | None,
    run_at: datetime | None,
    max_attempts: int | None,
    idempotency_key: str | None,
    *,
    index: int | None = None,
    max_bytes: int | None = None,
    max_depth: int = MAX_DEPTH,
    relay_key: bool = False,
) -> ValidatedJob:
    """One job's fields checked and in the form the inserts take (the payload as JSON
    text); a broken rule raises ValidationError naming the field (`jobs[i].field` with
    `index`). Everything PostgreSQL would refuse is refused here (core/limits.py), so a
    ValidationError leaves the caller's transaction usable. `max_bytes`: the payload size
    limit, read from POSTRELAY_MAX_PAYLOAD_BYTES when None; `max_depth` its nesting limit.
    `relay_key`: the key is the outbox relay's own, which alone may start with `outbox:`."""

    def field_name(name: str) -> str:
        return name if index is None else f"jobs[{index}].{name}"

    if not isinstance(kind, str) or not kind:
        raise ValidationError(field_name("kind"), "must be a non-empty string")
    if len(kind) > MAX_KIND_CHARS or not kind.isascii() or "\x00" in kind:
        checked_text(kind, field_name("kind"), MAX_KIND_CHARS)
    if not isinstance(payload, Mapping):
        raise ValidationError(
            field_name("payload"),
            f"must be a JSON object (a mapping), got {type(payload).__name__}",
        )
    try:
        payload_json = jsontext.encode_document(
            payload, "payload", max_payload_bytes() if max_bytes is None else max_bytes,
            max_depth)
    except ValidationError as exc:  # named here, not up front: the f-string costs per job
        raise type(exc)(field_name(exc.field), exc.rule) from None
    if tenant_id is None:
        raise ValidationError(field_name("tenant_id"), "is required")
    try:
        tenant = tenant_id if isinstance(tenant_id, UUID) else UUID(str(tenant_id))
    except ValueError:
        raise ValidationError(
            field_name("tenant_id"), f"must be a UUID, got {tenant_id!r}"
        ) from None
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValidationError(field_name("priority"), "must be an integer")
    if not SMALLINT_MIN <= priority <= SMALLINT_MAX:
        raise ValidationError(
            field_name("priority"), f"must be between {SMALLINT_MIN} and {SMALLINT_MAX} (smallint)"
        )
    if delay is not None and run_at is not None:
        raise ValidationError(field_name("delay"), "give either delay or run_at, not both")
    delay_secs = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if delay_secs is not None and (
        isinstance(delay_secs, bool) or not isinstance(delay_secs, int | float)
        or not 0 <= delay_secs <= MAX_DELAY_SECS  # NaN fails both comparisons
    ):
        raise ValidationError(
            field_name("delay"), f"must be a number of seconds from 0 to {MAX_DELAY_SECS} "
                                 f"(10 years), got {delay_secs!r}")
    if run_at is not None:
        if not isinstance(run_at, datetime) or run_at.utcoffset() is None:
            raise ValidationError(field_name("run_at"), "must be a timezone-aware datetime")
        if not run_at_in_reach(run_at, utcnow()):
            raise ValidationError(
                field_name("run_at"), f"must be at most {MAX_DELAY_SECS} seconds (10 years) "
                                      f"from now, in years 1 to 9999 in UTC, got {run_at}")
    attempts = default_max_attempts() if max_attempts is None else max_attempts
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= INT_MAX:
        raise ValidationError(field_name("max_attempts"),
                              f"must be an integer between 1 and {INT_MAX}")
    if idempotency_key is not None:
        if not isinstance(idempotency_key, str) or not idempotency_key:
            raise ValidationError(field_name("idempotency_key"),
                                  "must be a non-empty string or None")
        if (len(idempotency_key) > MAX_KEY_CHARS or not idempotency_key.isascii()
                or "\x00" in idempotency_key):  # the close look only when the cheap one fails
            checked_text(idempotency_key, field_name("idempotency_key"), MAX_KEY_CHARS)
        if idempotency_key.startswith(RELAY_KEY_PREFIX) and not relay_key:
            raise ValidationError(field_name("idempotency_key"),
                                  f"must not start with {RELAY_KEY_PREFIX!r} (the outbox "
                                  "relay's prefix for the keys of its jobs)")
    return {
        "kind": kind,
        "payload": payload_json,
        "tenant_id": tenant,
        "priority": priority,
        "delay": float(delay_secs or 0.0),
        "run_at": run_at,
        "max_attempts": attempts,
        "idempotency_key": idempotency_key,
    }
