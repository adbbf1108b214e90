"""Background work inside workers: stale-claim rescue, flow-control tidying and the done
rollup (once across all workers, by a leader's lock or lease), the cron scheduler (in every
worker; a slot still fires once) and the retention handler. Leases are for efficiency;
guarded statements and unique keys make an accidental double run harmless (correctness)."""

from postrelay.queue.maintenance.flowkeeper import FlowKeeper, FlowResult
from postrelay.queue.maintenance.leader import Maintenance, maintenance_interval
from postrelay.queue.maintenance.rescuer import Rescuer
from postrelay.queue.maintenance.retention import (
    AUDIT_TARGET,
    RETENTION_KIND,
    Cleaner,
    DeleteBatch,
    audit_cleaner,
    cleanup_handler,
)
from postrelay.queue.maintenance.rollup import DoneRollup
from postrelay.queue.maintenance.scheduler import CronScheduler

__all__ = [
    "AUDIT_TARGET",
    "RETENTION_KIND",
    "Cleaner",
    "CronScheduler",
    "DeleteBatch",
    "DoneRollup",
    "FlowKeeper",
    "FlowResult",
    "Maintenance",
    "Rescuer",
    "audit_cleaner",
    "cleanup_handler",
    "maintenance_interval",
]
