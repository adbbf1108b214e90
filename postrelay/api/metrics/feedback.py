"""Delivery feedback's figures: what arrived in the last 24 hours by kind and source, the
inbound receiver's inbox backlog, and each tenant's bounce and complaint rates over 24 hours
and 7 days."""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import Connection

from postrelay.orchestrator import feedback_counts, feedback_rates, inbox_backlog

WINDOWS = ("24h", "7d")


def read_feedback(conn: Connection) -> list[Metric]:
    received = GaugeMetricFamily(
        "postrelay_email_feedback_24h",
        "Delivery feedback received in the last 24 hours, by kind and source.",
        labels=["kind", "source"])
    unmatched = GaugeMetricFamily(
        "postrelay_email_feedback_unmatched_24h",
        "Of that, feedback that matched no message (forged, foreign or too old).",
        labels=["kind", "source"])
    for row in feedback_counts(conn):
        received.add_metric([row["kind"], row["source"]], row["received"])
        unmatched.add_metric([row["kind"], row["source"]], row["unmatched"])
    return [received, unmatched]


def read_inbound(conn: Connection) -> list[Metric]:
    inbox = inbox_backlog(conn)
    return [
        GaugeMetricFamily(
            "postrelay_feedback_inbox",
            "Mail `postrelay inbound` accepted (answered 250) and has not recorded yet.",
            value=inbox["waiting"]),
        GaugeMetricFamily(
            "postrelay_feedback_inbox_oldest_age_seconds",
            "How long the oldest message of the inbound inbox has waited (0 if none).",
            value=inbox["oldest_age_secs"] or 0.0),
    ]


class EmailRates:
    """Each tenant's bounce and complaint rates, for `max_tenants` tenants at most: those
    that sent the most in 7 days, ties by tenant id, so the set holds still from scrape to
    scrape. The rates read a week of the email log, so they are computed at most once a
    minute whatever the scrape rate."""

    TTL_SECS = 60.0

    def __init__(self, max_tenants: int) -> None:
        self.max_tenants = max_tenants
        self._rows: list[dict[str, Any]] = []
        self._at = float("-inf")
        self._lock = threading.Lock()

    def read(self, conn: Connection) -> list[Metric]:
        rows = self._cached(conn)
        ranked = sorted(rows, key=lambda row: (-row["messages_7d"], str(row["tenant_id"])))
        kept = {row["tenant_id"] for row in ranked[:self.max_tenants]}
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
        for row in rows:
            if row["tenant_id"] not in kept:
                continue
            for window in WINDOWS:
                key = [str(row["tenant_id"]), row["tenant_name"], window]
                families["messages"].add_metric(key, row[f"messages_{window}"])
                for name in ("bounce", "complaint"):
                    value = row[f"{name}_rate_{window}"]
                    if value is not None:
                        families[name].add_metric(key, value)
        omitted = GaugeMetricFamily(
            "postrelay_email_rate_tenants_omitted",
            "Tenants with messages answered in 7 days whose rates were left out "
            "(POSTRELAY_METRICS_MAX_TENANTS).", value=len(rows) - len(kept))
        return [*families.values(), omitted]

    def _cached(self, conn: Connection) -> list[dict[str, Any]]:
        with self._lock:
            if time.monotonic() - self._at >= self.TTL_SECS:
                self._rows = feedback_rates(conn)
                self._at = time.monotonic()
            return self._rows
