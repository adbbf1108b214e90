"""The generic job-queue core: enqueue in the caller's transaction, claim with SKIP LOCKED,
retry with backoff, dead-letter, rescue stale claims, clean up. Knows nothing of email or
outbox events."""

# Exported on purpose for the packages above (see docs/architecture.md): the operator's
# functions the CLI, the API and the dashboard share; what the relay needs to enqueue jobs it
# has validated already; the worker and its background services for the runtime.
from postrelay.core.rates import parse_rate
from postrelay.queue.admin import (
    CANCEL_LIMIT_MAX,
    LIST_LIMIT_MAX,
    REQUEUE_LIMIT_MAX,
    Cancelled,
    JobView,
    dlq_discard,
    dlq_list,
    dlq_requeue,
    dlq_retry,
    job_cancel,
    job_get,
    job_list,
    jobs_cancel,
    made_by_tenant_key,
    queue_status,
    tenant_list,
)
from postrelay.queue.backoff import Backoff, ExponentialBackoff, FixedBackoff, backoff_from
from postrelay.queue.cron import CronEntry, cron_create, cron_delete, cron_list
from postrelay.queue.effects import EffectWriter, RowWriter, record_with_outcome
from postrelay.queue.enqueue import (
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
    enqueue_validated_async,
    job_kinds,
    job_kinds_async,
)
from postrelay.queue.jobspec import (
    INT_MAX,
    MAX_DELAY_SECS,
    RELAY_KEY_PREFIX,
    SMALLINT_MAX,
    SMALLINT_MIN,
    JobSpec,
    ValidatedJob,
    default_max_attempts,
    validated_job,
)
from postrelay.queue.limits import (
    Limit,
    limit_ensure_rate,
    limit_list,
    limit_remove,
    limit_set,
)
from postrelay.queue.maintenance import (
    AUDIT_TARGET,
    RETENTION_KIND,
    Cleaner,
    CronScheduler,
    DeleteBatch,
    DoneRollup,
    FlowKeeper,
    Maintenance,
    Rescuer,
    audit_cleaner,
    cleanup_handler,
    maintenance_interval,
)
from postrelay.queue.metrics import WorkerMetrics, serve_metrics
from postrelay.queue.model import Job
from postrelay.queue.outcome import PermanentError, RetryAfter, Snooze, StopJob
from postrelay.queue.pauses import Pause, pause, pause_list, resume
from postrelay.queue.registry import Registry, default_registry, handler
from postrelay.queue.reserved import RESERVED_CRON_PREFIX, TENANT_FORBIDDEN_KINDS, check_kind
from postrelay.queue.schema import STATUSES, SYSTEM_TENANT_ID
from postrelay.queue.tenants import ensure_tenant, ensure_tenant_async
from postrelay.queue.throttles import (
    Throttle,
    ThrottlePolicy,
    throttle_end,
    throttle_list,
    throttle_refused,
)
from postrelay.queue.worker import Worker
from postrelay.queue.workerconfig import WorkerConfig

__all__ = [
    "AUDIT_TARGET",
    "CANCEL_LIMIT_MAX",
    "Cancelled",
    "Backoff",
    "Cleaner",
    "DeleteBatch",
    "CronEntry",
    "DoneRollup",
    "CronScheduler",
    "EffectWriter",
    "FlowKeeper",
    "ExponentialBackoff",
    "FixedBackoff",
    "INT_MAX",
    "Job",
    "Limit",
    "JobSpec",
    "JobView",
    "LIST_LIMIT_MAX",
    "MAX_DELAY_SECS",
    "RELAY_KEY_PREFIX",
    "Maintenance",
    "Pause",
    "PermanentError",
    "REQUEUE_LIMIT_MAX",
    "RESERVED_CRON_PREFIX",
    "RETENTION_KIND",
    "Registry",
    "Rescuer",
    "RetryAfter",
    "RowWriter",
    "SMALLINT_MAX",
    "SMALLINT_MIN",
    "STATUSES",
    "SYSTEM_TENANT_ID",
    "Snooze",
    "StopJob",
    "TENANT_FORBIDDEN_KINDS",
    "Throttle",
    "ThrottlePolicy",
    "ValidatedJob",
    "Worker",
    "WorkerConfig",
    "WorkerMetrics",
    "audit_cleaner",
    "backoff_from",
    "check_kind",
    "cleanup_handler",
    "cron_create",
    "cron_delete",
    "cron_list",
    "default_max_attempts",
    "default_registry",
    "dlq_discard",
    "dlq_list",
    "dlq_requeue",
    "dlq_retry",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "enqueue_validated_async",
    "ensure_tenant",
    "ensure_tenant_async",
    "handler",
    "job_cancel",
    "job_get",
    "job_kinds",
    "job_kinds_async",
    "job_list",
    "limit_ensure_rate",
    "limit_list",
    "limit_remove",
    "limit_set",
    "jobs_cancel",
    "made_by_tenant_key",
    "maintenance_interval",
    "parse_rate",
    "pause",
    "pause_list",
    "queue_status",
    "record_with_outcome",
    "resume",
    "serve_metrics",
    "tenant_list",
    "throttle_end",
    "throttle_list",
    "throttle_refused",
    "validated_job",
]
