"""One scrape of `/metrics`: every collector reads the database in a transaction of its own,
on one connection, so that a collector that fails (a table missing or locked, a query that
errors) costs only its own families and says so in `postrelay_collector_up`.

A collector, not gauges updated in the background, so that any API process reports the
same numbers and nothing runs between scrapes. Counters and histograms of claims,
completions and durations belong to the worker processes, which see those events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from postrelay.core.sqlfiles import load_queries
from postrelay.core.telemetry import event

METRICS_SQL = load_queries("postrelay.api", "sql/metrics.sql")
# Well below Prometheus's default scrape timeout (10 s) even if every collector waits.
LOCK_TIMEOUT = "1s"


@dataclass(frozen=True, slots=True)
class Source:
    """A named collector: `read` returns its families whole, or raises."""

    name: str
    read: Callable[[Connection], list[Metric]]


class ScrapeCollector(Collector):
    """Runs each source and adds `postrelay_database_up` and `postrelay_collector_up`."""

    def __init__(self, engine: Engine, sources: Sequence[Source]) -> None:
        self.engine = engine
        self.sources = tuple(sources)

    def collect(self) -> Iterator[Metric]:
        up = dict.fromkeys((source.name for source in self.sources), False)
        families: list[Metric] = []
        try:
            with self.engine.connect() as conn:
                for index, source in enumerate(self.sources):
                    if conn.invalidated:  # lost mid-scrape: no reconnect per collector
                        skipped = [s.name for s in self.sources[index:]]
                        event("postrelay.api.metrics_failed", logging.WARNING,
                              collector=",".join(skipped), error="connection lost")
                        break
                    read = self._read(conn, source)
                    if read is not None:
                        families.extend(read)
                        up[source.name] = True
        except SQLAlchemyError as exc:
            # A scrape must still answer: say the database is down rather than fail.
            event("postrelay.api.metrics_failed", logging.WARNING, collector="all",
                  error=repr(exc))
        yield GaugeMetricFamily(
            "postrelay_database_up",
            "1 if the scrape could read the database (at least one collector did).",
            value=int(any(up.values())))
        health = GaugeMetricFamily(
            "postrelay_collector_up",
            "1 if the collector read its figures this scrape; 0: its families are missing.",
            labels=["collector"])
        for name, ok in up.items():
            health.add_metric([name], int(ok))
        yield health
        yield from families

    @staticmethod
    def _read(conn: Connection, source: Source) -> list[Metric] | None:
        """The source's families, or None (logged, once) when it failed."""
        try:
            with conn.begin():
                conn.execute(METRICS_SQL["metrics_lock_timeout"], {"timeout": LOCK_TIMEOUT})
                return source.read(conn)
        except SQLAlchemyError as exc:
            event("postrelay.api.metrics_failed", logging.WARNING, collector=source.name,
                  error=repr(exc))
        except Exception as exc:  # a bug in one collector must not cost the others
            event("postrelay.api.metrics_failed", logging.ERROR, exc_info=exc,
                  collector=source.name, error=repr(exc))
        return None
