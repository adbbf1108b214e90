"""The queue's and the relay's figures: jobs by status and kind, the due backlog and its
age, the DLQ size, and the outbox's backlog, lag and dead events."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import Connection

from postrelay.queue import STATUSES, job_kinds, queue_status
from postrelay.relay import outbox_status


def read_queue(conn: Connection) -> list[Metric]:
    status = queue_status(conn)
    jobs = GaugeMetricFamily("postrelay_jobs", "Jobs by status and kind.",
                             labels=["status", "kind"])
    # Every kind of the mdm.job_kind enum, with or without jobs: a kind whose last jobs
    # retention deleted drops to 0 rather than vanishing, which rate() and absent() would
    # misread. The enum changes only by migration, so the series stay bounded (kinds x 5).
    # The kinds that have jobs are in it already; the union only makes sure of it.
    for kind in sorted({*job_kinds(conn), *status.by_kind}):
        counts = status.by_kind.get(kind, {})
        for name in STATUSES:  # zeros included, so a drained status drops to 0
            jobs.add_metric([name, kind], counts.get(name, 0))
    return [
        jobs,
        GaugeMetricFamily("postrelay_jobs_due_pending",
                          "Pending jobs already due, waiting only for a worker.",
                          value=status.due_pending),
        GaugeMetricFamily("postrelay_oldest_due_pending_age_seconds",
                          "How long the oldest due pending job has waited (0 if none).",
                          value=status.oldest_due_age_secs or 0.0),
        GaugeMetricFamily("postrelay_dlq_jobs", "Jobs in the dead-letter queue.",
                          value=status.by_status.get("dlq", 0)),
    ]


def read_outbox(conn: Connection) -> list[Metric]:
    outbox = outbox_status(conn, dead_limit=0)
    return [
        GaugeMetricFamily("postrelay_outbox_backlog",
                          "Outbox events not relayed yet (neither handled nor dead).",
                          value=outbox.backlog),
        GaugeMetricFamily("postrelay_outbox_lag_seconds",
                          "Age of the oldest outbox event not relayed yet (0 if none).",
                          value=outbox.lag_secs or 0.0),
        GaugeMetricFamily("postrelay_outbox_dead",
                          "Outbox events parked as dead after failed routing.",
                          value=outbox.dead),
    ]
