"""Prometheus metrics read from the database at scrape time.

A collector (not gauges updated in the background) so that any API process reports the
same numbers and nothing runs between scrapes. Counters and histograms of claims,
completions and durations belong to the worker processes, which see those events.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from postrelay.core.telemetry import event
from postrelay.orchestrator import feedback_counts, feedback_rates, inbox_backlog
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


class FeedbackCollector(Collector):
    """Delivery feedback received in the last 24 hours by kind and source, the inbound
    receiver's inbox backlog, and each tenant's bounce and complaint rates over 24 hours and
    7 days. The rates read a week of the email log, so they are computed at most once a
    minute whatever the scrape rate."""

    RATES_TTL_SECS = 60.0

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._rates: list[dict[str, Any]] = []
        self._rates_at = float("-inf")
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        try:
            with self.engine.connect() as conn:
                counts = feedback_counts(conn)
                inbox = inbox_backlog(conn)
                rates = self._cached_rates(conn)
        except SQLAlchemyError as exc:  # postrelay_database_up already says why
            event("postrelay.api.metrics_failed", logging.WARNING, error=repr(exc))
            return
        received = GaugeMetricFamily(
            "postrelay_email_feedback_24h",
            "Delivery feedback received in the last 24 hours, by kind and source.",
            labels=["kind", "source"])
        unmatched = GaugeMetricFamily(
            "postrelay_email_feedback_unmatched_24h",
            "Of that, feedback that matched no message (forged, foreign or too old).",
            labels=["kind", "source"])
        for row in counts:
            received.add_metric([row["kind"], row["source"]], row["received"])
            unmatched.add_metric([row["kind"], row["source"]], row["unmatched"])
        yield received
        yield unmatched
        yield GaugeMetricFamily(
            "postrelay_feedback_inbox",
            "Mail `postrelay inbound` accepted (answered 250) and has not recorded yet.",
            value=inbox["waiting"])
        yield GaugeMetricFamily(
            "postrelay_feedback_inbox_oldest_age_seconds",
            "How long the oldest message of the inbound inbox has waited (0 if none).",
            value=inbox["oldest_age_secs"] or 0.0)
        labels = ["tenant_id", "tenant", "window"]
        families = {
            "bounce": GaugeMetricFamily(
                "postrelay_email_bounce_rate",
                "Share of the messages answered in the window that bounced (at send time "
                "or later).", labels=labels),
            "complaint": GaugeMetricFamily(
                "postrelay_email_complaint_rate",
                "Share of the messages answered in the window that drew a complaint.",
                labels=labels),
            "messages": GaugeMetricFamily(
                "postrelay_email_answered", "Messages answered (sent, partial, bounced) in "
                "the window, the rates' denominator.", labels=labels),
        }
        for row in rates:
            for window in ("24h", "7d"):
                key = [str(row["tenant_id"]), row["tenant_name"], window]
                families["messages"].add_metric(key, row[f"messages_{window}"])
                for name in ("bounce", "complaint"):
                    value = row[f"{name}_rate_{window}"]
                    if value is not None:
                        families[name].add_metric(key, value)
        yield from families.values()

    def _cached_rates(self, conn: Any) -> list[dict[str, Any]]:
        with self._lock:
            if time.monotonic() - self._rates_at >= self.RATES_TTL_SECS:
                self._rates = feedback_rates(conn)
                self._rates_at = time.monotonic()
            return self._rates


def metrics_registry(engine: Engine) -> CollectorRegistry:
    """A registry of this app's own: two apps in one process never share metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(engine))
    registry.register(FeedbackCollector(engine))
    return registry
