"""A worker process's own Prometheus metrics: claims, outcomes, run times.

    metrics = WorkerMetrics()
    worker = Worker(engine, config, registry=handlers, metrics=metrics)
    server = serve_metrics(metrics, 9464)   # http://127.0.0.1:9464/metrics

Each WorkerMetrics has a CollectorRegistry of its own (no process-wide globals), so two
workers in one process, or a test next to a running service, never share counters. The
numbers are taken where the worker's events are: after a claim statement, and where a run's
outcome goes to the completer (the point of `postrelay.job.finished`, whose `kind` and
`status` fields are the labels here).

The hot path pays little per job: one counter increment per kind per claim batch, and a
counter increment and a histogram observation per finished run, on label-bound children
created once per kind (and per kind and status) and cached, never `.labels()` per job.
`postrelay_worker_running_jobs` and `postrelay_worker_held_jobs` are read from the worker at
scrape time, not kept up to date.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from postrelay.core.telemetry import event
from postrelay.queue.model import Job
from postrelay.queue.outcome import Transition

# Handler run times: from a millisecond no-op to the default lease (450 s).
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
# Jobs per claim statement: at most the worker's concurrency plus what it claims ahead.
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
# `status` of postrelay_jobs_finished_total: the job's next state, as in the database and in
# the API's postrelay_jobs{status}, except a run handed back at shutdown (uncounted attempt).
FINISHED_STATUSES = ("done", "pending", "failed", "dlq", "returned")


class _KindMetrics:
    """The label-bound children of one kind, so recording needs no `.labels()` call."""

    __slots__ = ("claimed", "duration", "finished")

    def __init__(self, metrics: WorkerMetrics, kind: str) -> None:
        self.claimed = metrics.claimed.labels(kind=kind)
        self.duration = metrics.duration.labels(kind=kind)
        self.finished = {
            status: metrics.finished.labels(kind=kind, status=status)
            for status in FINISHED_STATUSES
        }


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.claimed = Counter(
            "postrelay_jobs_claimed", "Jobs claimed by this worker, by kind.",
            ["kind"], registry=self.registry,
        )
        self.finished = Counter(
            "postrelay_jobs_finished",
            "Runs finished by this worker, by kind and the job's next status "
            "(done, pending = retry scheduled, failed, dlq, returned = handed back at shutdown).",
            ["kind", "status"], registry=self.registry,
        )
        self.duration = Histogram(
            "postrelay_job_duration_seconds", "Handler run time, by kind.",
            ["kind"], buckets=DURATION_BUCKETS, registry=self.registry,
        )
        self.claim_batch = Histogram(
            "postrelay_claim_batch_size", "Jobs per claim statement that claimed any.",
            buckets=BATCH_BUCKETS, registry=self.registry,
        )
        self.running = Gauge(
            "postrelay_worker_running_jobs", "Jobs whose handler is running now.",
            registry=self.registry,
        )
        self.held = Gauge(
            "postrelay_worker_held_jobs", "Jobs claimed ahead of a free slot, waiting to start.",
            registry=self.registry,
        )
        self._kinds: dict[str, _KindMetrics] = {}

    def bind(self, kinds: Iterable[str], running: Callable[[], float],
             held: Callable[[], float]) -> None:
        """Called by the worker: export its kinds at zero from the start (so `rate()` sees
        the first increment) and read the running and held job counts from `running` and
        `held` at scrape time."""
        for kind in kinds:
            self._kind(kind)
        self.running.set_function(running)
        self.held.set_function(held)

    def _kind(self, kind: str) -> _KindMetrics:
        children = self._kinds.get(kind)
        if children is None:
            children = self._kinds[kind] = _KindMetrics(self, kind)
        return children

    def claimed_batch(self, jobs: Sequence[Job]) -> None:
        """One claim statement returned `jobs` (called only when it claimed any)."""
        self.claim_batch.observe(len(jobs))
        per_kind: dict[str, int] = {}
        for job in jobs:  # one increment per kind, not per job: a batch is mostly one kind
            per_kind[job.kind] = per_kind.get(job.kind, 0) + 1
        for kind, count in per_kind.items():
            self._kind(kind).claimed.inc(count)

    def finished_run(self, kind: str, transition: Transition, duration_secs: float) -> None:
        """A run ended in `transition` after `duration_secs`. A run cut short at shutdown
        is counted as `returned` but kept out of the duration histogram."""
        children = self._kind(kind)
        if transition.refund:
            children.finished["returned"].inc()
            return
        children.duration.observe(duration_secs)
        children.finished[transition.status].inc()

    def returned_unrun(self, kind: str) -> None:
        """A claimed job handed back at shutdown before its run began (no duration)."""
        self._kind(kind).finished["returned"].inc()


def serve_metrics(metrics: WorkerMetrics, port: int, host: str = "127.0.0.1") -> WSGIServer:
    """Serve `metrics` on http://host:port/metrics from a daemon thread; `shutdown()` the
    returned server to stop. Raises OSError if the port is taken."""
    server, _ = start_http_server(port, addr=host, registry=metrics.registry)
    event("postrelay.worker.metrics_serving", host=host, port=server.server_port)
    return server
