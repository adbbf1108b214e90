"""The API's request bodies and answers. These models are the OpenAPI schema: keep them true.

Bodies use the seed's camelCase (`delaySecs`, `maxAttempts`); jobs in answers use the seed's
snake_case (`max_attempts`, `scheduled_at`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar
from uuid import UUID

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from postrelay.access import MaxAttempts, Priority
from postrelay.queue import MAX_DELAY_SECS, CronEntry, JobView

T = TypeVar("T")

JobStatus = Literal["pending", "running", "done", "failed", "dlq"]


def _no_nul(value: Any) -> Any:
    # PostgreSQL text and jsonb cannot hold U+0000; refuse it as bad input, not a 500.
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("must not contain the NUL character (U+0000)")
    if isinstance(value, dict):
        for key, item in value.items():
            _no_nul(key)
            _no_nul(item)
    elif isinstance(value, list):
        for item in value:
            _no_nul(item)
    return value


def _time_text(value: Any) -> Any:
    # pydantic reads a number as seconds since 1970, so `"since": -1073741825` replayed the
    # outbox from 1936; the schema says an ISO 8601 string.
    if value is not None and not isinstance(value, str | datetime):
        raise ValueError("must be a time as ISO 8601 text, such as 2026-12-07T08:00:00Z")
    return value


Text = Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_no_nul)]
# A time in a body: ISO 8601 text only.
Moment = Annotated[datetime, BeforeValidator(_time_text)]
Payload = Annotated[dict[str, Any], AfterValidator(_no_nul)]
DelaySecs = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=MAX_DELAY_SECS)]


class Envelope(BaseModel, Generic[T]):
    """Every successful answer."""

    data: T
    meta: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    code: str = Field(examples=["invalid_request"])
    message: str = Field(examples=["limit: must be between 1 and 500"])
    field: str | None = Field(default=None, description="The offending input, for 400s.")


class ErrorEnvelope(BaseModel):
    """Every error: `data` is null."""

    data: None = None
    error: ErrorBody


class _Body(BaseModel):
    # Unknown fields are refused: a typo such as `delay_secs` must not be silently ignored.
    model_config = ConfigDict(extra="forbid", populate_by_name=False)


class EnqueueBody(_Body):
    kind: Text = Field(description="A job kind known to the database (mdm.job_kind).")
    payload: Payload = Field(default_factory=dict, description="A JSON object.")
    delay_secs: DelaySecs | None = Field(default=None, alias="delaySecs",
                                         description="Seconds before the first attempt.")
    max_attempts: MaxAttempts | None = Field(
        default=None, alias="maxAttempts",
        description="Default: the service setting POSTRELAY_JOB_MAX_RETRIES.")
    priority: Priority | None = Field(default=None, description="Lower runs first; default 100.")
    idempotency_key: Text | None = Field(default=None, alias="idempotencyKey")
    tenant_id: UUID | None = Field(
        default=None, alias="tenantId",
        description="Default: the key's tenant, or the system tenant for the service-role key.")


class CronBody(_Body):
    name: Text = Field(description="Unique per tenant; names starting `postrelay.` are the "
                                   "system's.")
    schedule: Text = Field(
        description="5 fields (min hour day month weekday) or 6 (seconds first), UTC.",
        examples=["0 3 * * *"])
    kind: Text
    payload: Payload = Field(default_factory=dict, description="Frozen at creation.")
    tenant_id: UUID | None = Field(default=None, alias="tenantId")
    priority: Priority | None = None
    max_attempts: MaxAttempts | None = Field(default=None, alias="maxAttempts")


class JobOut(BaseModel):
    """A job as the hosted seed shows it; `status` values are the database's."""

    id: UUID
    kind: str
    tenant_id: UUID
    priority: int
    payload: dict[str, Any]
    status: JobStatus
    attempts: int
    max_attempts: int
    error: str | None = Field(description="The last error (aa_job.last_error).")
    scheduled_at: datetime = Field(description="When the job is due (aa_job.available_at).")
    started_at: datetime | None = Field(description="The last claim (aa_job.claimed_at).")
    completed_at: datetime | None
    created_at: datetime
    idempotency_key: str | None

    @classmethod
    def of(cls, job: JobView) -> JobOut:
        # status: the database's text, which pydantic checks against JobStatus here.
        return cls(
            id=job.id, kind=job.kind, tenant_id=job.tenant_id, priority=job.priority,
            payload=job.payload, status=job.status,  # type: ignore[arg-type]
            attempts=job.attempts, max_attempts=job.max_attempts, error=job.last_error,
            scheduled_at=job.available_at, started_at=job.claimed_at,
            completed_at=job.completed_at, created_at=job.created_at,
            idempotency_key=job.idempotency_key,
        )


class CronOut(BaseModel):
    """A cron entry; `last_run` and `next_run` are null until its first firing;
    `failing_since` and `last_error` are null while its firings succeed."""

    id: UUID
    name: str
    tenant_id: UUID
    schedule: str = Field(description="As stored: 6 fields, seconds first.")
    kind: str
    payload: dict[str, Any]
    priority: int
    max_attempts: int | None
    last_run: datetime | None
    next_run: datetime | None
    created_at: datetime
    failing_since: datetime | None = Field(
        description="Its firings fail (its slot stays due and is tried every round): since "
                    "the first of them. Null once one succeeds.")
    last_error: str | None = Field(description="Why its latest firing failed, while they do.")

    @classmethod
    def of(cls, entry: CronEntry) -> CronOut:
        return cls(
            id=entry.id, name=entry.name, tenant_id=entry.tenant_id, schedule=entry.schedule,
            kind=entry.kind, payload=entry.payload, priority=entry.priority,
            max_attempts=entry.max_attempts, last_run=entry.last_run, next_run=entry.next_run,
            created_at=entry.created_at, failing_since=entry.failing_since,
            last_error=entry.last_error,
        )


class Requeued(BaseModel):
    requeued: int


class Discarded(BaseModel):
    id: UUID
    discarded: Literal[True] = True


class CronDeleted(BaseModel):
    name: str
    deleted: Literal[True] = True


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["ready"] = "ready"
    revision: str | None
    head: str | None


# --- the outbox -------------------------------------------------------------------------

OutboxEventStatus = Literal["pending", "retrying", "handled", "dead"]


class OutboxDeadEvent(BaseModel):
    """An event whose routing failed `POSTRELAY_RELAY_MAX_ATTEMPTS` times; it waits for a
    replay."""

    id: UUID
    tenant_id: UUID
    event_type: str
    aggregate_type: str
    aggregate_id: str
    attempts: int
    last_error: str | None
    created_at: datetime
    dead_at: datetime


class OutboxStatusOut(BaseModel):
    """The relay's backlog right now (a tenant key: its tenant's events only)."""

    backlog: int = Field(description="Events not relayed yet (neither handled nor dead).")
    lag_secs: float | None = Field(description="Age of the oldest of them; null if none.")
    dead: int
    handled: int
    retrying: int = Field(description="Backlog events whose routing failed at least once.")
    dead_events: list[OutboxDeadEvent] = Field(description="The 20 most recent deaths.")

    @classmethod
    def of(cls, status: Any) -> OutboxStatusOut:  # postrelay.relay.admin.OutboxStatus
        return cls(
            backlog=status.backlog, lag_secs=status.lag_secs, dead=status.dead,
            handled=status.handled, retrying=status.retrying,
            dead_events=[OutboxDeadEvent(**e) for e in status.dead_events],
        )


class OutboxJobOut(BaseModel):
    """A job the relay made of an event; `kind` and `status` are null once it is pruned."""

    route: str
    job_id: UUID
    kind: str | None
    status: JobStatus | None
    attempts: int | None


class OutboxEventOut(BaseModel):
    """One outbox event, its relay state and every job it produced."""

    id: UUID
    tenant_id: UUID
    event_type: str
    aggregate_type: str
    aggregate_id: str
    payload: dict[str, Any]
    headers: dict[str, Any]
    status: OutboxEventStatus
    attempts: int = Field(description="Failed routing attempts.")
    error: str | None = Field(description="The last routing error.")
    created_at: datetime
    created_by: str | None
    available_at: datetime = Field(description="When the relay may try it (again).")
    handled_at: datetime | None
    dead_at: datetime | None
    jobs: list[OutboxJobOut]

    @classmethod
    def of(cls, event: Any) -> OutboxEventOut:  # postrelay.relay.admin.OutboxEventView
        return cls(
            id=event.id, tenant_id=event.tenant_id, event_type=event.event_type,
            aggregate_type=event.aggregate_type, aggregate_id=event.aggregate_id,
            payload=event.payload, headers=event.headers, status=event.status,
            attempts=event.attempts, error=event.last_error, created_at=event.created_at,
            created_by=event.created_by, available_at=event.available_at,
            handled_at=event.handled_at, dead_at=event.dead_at,
            jobs=[OutboxJobOut(**j) for j in event.jobs],
        )


class ReplayBody(_Body):
    """One event (`eventId`), or every event created in [`since`, `until`); either bound of
    the range may be left out. `dead`: only the events the relay gave up on, in the range or
    (alone) all of them. A time without a zone is UTC."""

    event_id: UUID | None = Field(default=None, alias="eventId")
    since: Moment | None = None
    until: Moment | None = None
    # strict: 1 or "yes" is not true, as for a pause's `all`.
    dead: bool = Field(default=False, strict=True,
                       description="Only events the relay gave up on (not with eventId).")


class Replayed(BaseModel):
    replayed: int
