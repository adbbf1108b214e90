"""Prometheus metrics read from the database at scrape time.

A collector (not gauges updated in the background) so that any API process reports the
same numbers and nothing runs between scrapes. Counters and histograms of claims,
completions and durations belong to the worker processes, which see those events.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from postrelay.core.telemetry import event
from postrelay.queue import STATUSES, queue_status
from postrelay.relay import outbox_status


class QueueCollector(Collector):
    """Jobs by status and kind, the due backlog and its age, the DLQ size, and the relay's
    outbox backlog, lag and dead events."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        try:
            with self.engine.connect() as conn:
                status = queue_status(conn)
                outbox = outbox_status(conn, dead_limit=0)
        except SQLAlchemyError as exc:
            # A scrape must still answer: say the database is down rather than fail.
            event("postrelay.api.metrics_failed", logging.WARNING, error=repr(exc))
            yield GaugeMetricFamily("postrelay_database_up",
                                    "1 if the last scrape could read the database.", value=0)
            return
        yield GaugeMetricFamily("postrelay_database_up",
                                "1 if the last scrape could read the database.", value=1)
        jobs = GaugeMetricFamily("postrelay_jobs", "Jobs by status and kind.",
                                 labels=["status", "kind"])
        for kind in sorted(status.by_kind):
            counts = status.by_kind[kind]
            for name in STATUSES:  # zeros included, so a drained status drops to 0
                jobs.add_metric([name, kind], counts.get(name, 0))
        yield jobs
        yield GaugeMetricFamily("postrelay_jobs_due_pending",
                                "Pending jobs already due, waiting only for a worker.",
                                value=status.due_pending)
        yield GaugeMetricFamily("postrelay_oldest_due_pending_age_seconds",
                                "How long the oldest due pending job has waited (0 if none).",
                                value=status.oldest_due_age_secs or 0.0)
        yield GaugeMetricFamily("postrelay_dlq_jobs", "Jobs in the dead-letter queue.",
                                value=status.by_status.get("dlq", 0))
        yield GaugeMetricFamily("postrelay_outbox_backlog",
                                "Outbox events not relayed yet (neither handled nor dead).",
                                value=outbox.backlog)
        yield GaugeMetricFamily("postrelay_outbox_lag_seconds",
                                "Age of the oldest outbox event not relayed yet (0 if none).",
                                value=outbox.lag_secs or 0.0)
        yield GaugeMetricFamily("postrelay_outbox_dead",
                                "Outbox events parked as dead after failed routing.",
                                value=outbox.dead)


def metrics_registry(engine: Engine) -> CollectorRegistry:
    """A registry of this app's own: two apps in one process never share metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(engine))
    return registry
