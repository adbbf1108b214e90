"""The generic job-queue core: enqueue in the caller's transaction, claim with SKIP LOCKED,
retry with backoff, dead-letter, rescue stale claims, clean up. Knows nothing of email or
outbox events."""

from postrelay.queue.backoff import Backoff, ExponentialBackoff, FixedBackoff
from postrelay.queue.effects import EffectWriter, record_with_outcome
from postrelay.queue.enqueue import JobSpec, enqueue, enqueue_many, job_kinds
from postrelay.queue.model import Job
from postrelay.queue.outcome import PermanentError, RetryAfter, Snooze, StopJob
from postrelay.queue.registry import Registry, handler
from postrelay.queue.tenants import ensure_tenant

__all__ = [
    "Backoff",
    "EffectWriter",
    "ExponentialBackoff",
    "FixedBackoff",
    "Job",
    "JobSpec",
    "PermanentError",
    "Registry",
    "RetryAfter",
    "Snooze",
    "StopJob",
    "enqueue",
    "enqueue_many",
    "ensure_tenant",
    "handler",
    "job_kinds",
    "record_with_outcome",
]
