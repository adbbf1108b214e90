"""What the earlier attempts of an email job left, and what that allows this one to do.

A message may be on its way from the moment its job is claimed: the claim commits before
the handler runs, and the SMTP handoff follows. So the claim is the durable record that a
message may have left, and nothing else is written before DATA. Each attempt names its log
row by an id its claim fixes (`attempt_log_id`: the job and the claim's moment), and writes
that row once, with its outcome, in the transaction that writes the job's next state.

An attempt that may have handed its message over ends without that row only when its worker
died. The rescuer then takes the job back, and its audit row names the lost claim; the next
attempt logs that claim's row `unknown`, under the id the lost attempt gave its own row (the
one its VERP address carries), so a bounce for that message finds it. An attempt stopped
while the message was with the SMTP pool (a timeout, a cancel, a shutdown) writes its own
row `unknown`. Whether an unknown outcome holds the job for an operator is the template's
policy; an operator's retry or requeue from the DLQ after it is the decision to send.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

from postrelay.core.ids import new_uuid

SENT = frozenset({"sent", "partial"})
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_VERSION_7 = (7 << 76) | (0x8000 << 48)  # the layout of core/ids.py: time-ordered
_RAND_A = 0xFFF << 64
_RAND_B = (1 << 62) - 1


def attempt_log_id(job_id: UUID, claimed_at: datetime) -> UUID:
    """The log row id of the attempt that claimed `job_id` at `claimed_at`: the same for
    whoever computes it, time-ordered like every other id (core/ids.py)."""
    micros = (claimed_at - _EPOCH) // timedelta(microseconds=1)
    digest = hashlib.blake2b(job_id.bytes + micros.to_bytes(8, "big", signed=True),
                             digest_size=16).digest()
    bits = int.from_bytes(digest)
    return UUID(int=(micros // 1000) << 80 | _VERSION_7 | bits & _RAND_A | bits & _RAND_B)


@dataclass(frozen=True, slots=True)
class Logged:
    """One log row of the job."""

    id: UUID
    attempt: int
    status: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Rescue:
    """A claim the rescuer took back from a worker that stopped heartbeating. Rescues
    recorded before migration 0020 do not name the claim's moment."""

    attempt: int
    claimed_at: datetime | None
    at: datetime


@dataclass(frozen=True, slots=True)
class LostAttempt:
    attempt: int
    log_id: UUID
    rescued_at: datetime


@dataclass(frozen=True, slots=True)
class SendCheck:
    """What `email_send_check_many` read for one job."""

    logged: tuple[Logged, ...]
    rescues: tuple[Rescue, ...]
    released_at: datetime | None  # the last retry or requeue from the DLQ
    suppressions: frozenset[tuple[str, str]]  # (category, address); '' is every category

    def suppressed(self, category: str | None) -> frozenset[str]:
        """The recipients suppressed for mail of `category` (None: none)."""
        return frozenset(address for kind, address in self.suppressions
                         if kind in ("", category or ""))

    @property
    def already_sent(self) -> bool:
        """An earlier attempt was accepted: the message is not sent again."""
        return any(row.status in SENT for row in self.logged)

    def lost_attempts(self, job_id: UUID) -> list[LostAttempt]:
        """The rescued attempts that have no log row yet (each gets an `unknown` one)."""
        ids = {row.id for row in self.logged}
        attempts = {row.attempt for row in self.logged}
        lost = []
        for rescue in self.rescues:
            if rescue.claimed_at is None:  # before 0020: a sending mark logged it, if any
                if rescue.attempt not in attempts:
                    lost.append(LostAttempt(rescue.attempt, new_uuid(), rescue.at))
                continue
            log_id = attempt_log_id(job_id, rescue.claimed_at)
            if log_id not in ids:
                lost.append(LostAttempt(rescue.attempt, log_id, rescue.at))
        return lost

    def unknown_undecided(self, lost: list[LostAttempt]) -> bool:
        """An outcome is unknown and no operator has sent the job back since it became so:
        the template's `on_unknown` policy decides whether this attempt sends."""
        since = self.released_at
        moments = [row.created_at for row in self.logged if row.status == "unknown"]
        moments += [attempt.rescued_at for attempt in lost]
        return any(since is None or moment > since for moment in moments)
