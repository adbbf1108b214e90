"""Maintenance that runs inside workers, once across all of them: stale-claim rescue and
retention. A leader lease picks the process (efficiency); guarded statements and unique
keys make an accidental double run harmless (correctness)."""

from postrelay.queue.maintenance.leader import Maintenance
from postrelay.queue.maintenance.rescuer import Rescuer
from postrelay.queue.maintenance.retention import RETENTION_KIND, Retention, cleanup_handler

__all__ = ["RETENTION_KIND", "Maintenance", "Rescuer", "Retention", "cleanup_handler"]
