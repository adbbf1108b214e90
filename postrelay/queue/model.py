"""What a handler receives: one claimed job."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID


@dataclass(frozen=True, slots=True)
class Job:
    id: UUID
    tenant_id: UUID
    kind: str
    payload: dict[str, Any]
    priority: int
    attempts: int  # this run's attempt number, counted at claim (1 on the first run)
    max_attempts: int
    available_at: datetime
    claimed_at: datetime
    created_at: datetime
    idempotency_key: str | None
    # Why the stored payload could not be read (then `payload` is empty): the job is
    # dead-lettered without running. None for every job whose payload reads.
    unreadable_payload: str | None = None

    @property
    def is_last_attempt(self) -> bool:
        return self.attempts >= self.max_attempts
