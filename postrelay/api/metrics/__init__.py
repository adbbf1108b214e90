"""Prometheus metrics read from the database at scrape time (`/metrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from postrelay.api.metrics.feedback import EmailRates, read_feedback, read_inbound
from postrelay.api.metrics.queue import read_outbox, read_queue
from postrelay.api.metrics.scrape import ScrapeCollector, Source


def metrics_registry(engine: Engine, *, max_tenants: int) -> CollectorRegistry:
    """A registry of this app's own: two apps in one process never share metrics.
    `max_tenants` bounds the tenants whose email rates are exported."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScrapeCollector(engine, [
        Source("queue", read_queue),
        Source("outbox", read_outbox),
        Source("feedback", read_feedback),
        Source("inbound", read_inbound),
        Source("email_rates", EmailRates(max_tenants).read),
    ]))
    return registry


__all__ = ["metrics_registry"]
