"""Print webhook delivery's figures for this machine: outbox events delivered per second by
one `postrelay worker` (its built-in webhook handler: read the event and the endpoint, sign,
POST, record the attempt, complete the job) to a receiver on loopback, beside a plain httpx
client posting as many requests of the same size to the same receiver at the same
concurrency.

    .venv/bin/python -m bench.webhook_bench [--deliveries 3000] [--concurrency 50] [--https]

The receiver (bench/http_sink.py) is a process of its own that answers 204; with --https it
serves a certificate of a throw-away authority (trustme), which the endpoint names as its
private CA and the baseline trusts. The events are emitted and relayed into their delivery
jobs before the worker starts; the delivery rate is timed from the first claim to the last
completion. Both keep their connections open between requests (the worker per target,
relay/webhooks/pool.py), so the baseline is the rate HTTP itself allows here, not a peer's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import trustme
from sqlalchemy.ext.asyncio import create_async_engine

from bench.harness import (
    REPO_ROOT,
    BenchDatabase,
    Row,
    WorkerProcess,
    bench_database,
    print_table,
    rate,
    ratio,
    wait_until,
)
from postrelay.relay import EventSpec, Relay, RouteRegistry, emit_many
from postrelay.relay.webhooks import EndpointDirectory, add_webhook_route, webhook_add

APP = "bench.noop_app"  # the webhook handler is built in; the app adds nothing to it
PAYLOAD = {"order": {"id": 0, "lines": [{"sku": f"SKU-{n}", "qty": n} for n in range(8)]}}


@dataclass(frozen=True)
class Sink:
    url: str
    pid: int
    ca_pem: str | None = None  # the authority of its certificate, over HTTPS


@contextmanager
def http_sink(https: bool = False) -> Iterator[Sink]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="postrelay-bench-https-") as folder:
        tls: list[str] = []
        ca = trustme.CA() if https else None
        if ca is not None:
            issued = ca.issue_cert("127.0.0.1")
            tls = [str(Path(folder, "cert.pem")), str(Path(folder, "key.pem"))]
            issued.cert_chain_pems[0].write_to_path(tls[0])
            issued.private_key_pem.write_to_path(tls[1])
        proc = subprocess.Popen([sys.executable, "-m", "bench.http_sink", str(port), *tls],
                                cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                stdin=subprocess.DEVNULL)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
            yield Sink(f"{'https' if https else 'http'}://127.0.0.1:{port}/hooks", proc.pid,
                       ca.cert_pem.bytes().decode() if ca is not None else None)
        finally:
            proc.terminate()
            proc.wait(10)


def delivery_jobs(bench: BenchDatabase, sink: Sink, n: int) -> None:
    """One endpoint, `n` events relayed into their `outbox_dispatch` jobs, not yet run."""
    with bench.engine.begin() as conn:
        webhook_add(conn, bench.tenant_id, sink.url, allow_private=True, ca_pem=sink.ca_pem)
        emit_many(conn, [EventSpec("order.placed", {**PAYLOAD, "n": i}, bench.tenant_id,
                                   "order", i) for i in range(n)])

    async def relay_all() -> None:
        engine = create_async_engine(bench.url)
        try:
            directory = EndpointDirectory(engine)
            await directory.run_once()
            routes = RouteRegistry()
            add_webhook_route(routes, directory)
            relay = Relay(engine, routes)
            while (await relay.run_once()).handled:
                pass
        finally:
            await engine.dispose()

    asyncio.run(relay_all())
    with bench.connect(autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE mdm.aa_job")


def delivery_rate(bench: BenchDatabase, sink: Sink, n: int, concurrency: int,
                  cpu: dict[str, float]) -> float:
    delivery_jobs(bench, sink, n)
    env = {"POSTRELAY_WEBHOOK_ALLOW_PRIVATE": "true"}
    with (WorkerProcess(bench, app=APP, concurrency=concurrency, env=env) as worker,
          bench.connect(autocommit=True) as watch):
        assert worker.proc is not None
        meter = bench.cpu_meter({"worker": worker.proc.pid, "sink": sink.pid})
        meter.start()
        wait_until(lambda: watch.execute(
            "SELECT count(*) FROM mdm.aa_job WHERE job_kind = 'outbox_dispatch' "
            "AND status = 'done'").fetchone()[0] >= n,
            timeout=600, poll=0.2, worker=worker, what="every delivery to be done")
        cpu.update(meter.stop())
        span = watch.execute("SELECT max(completed_at) - min(claimed_at) FROM mdm.aa_job "
                             "WHERE job_kind = 'outbox_dispatch'").fetchone()[0]
    return n / span.total_seconds()


def baseline_rate(sink: Sink, n: int, concurrency: int) -> float:
    body = json.dumps({"type": "order.placed", "data": PAYLOAD}).encode()

    async def post_all() -> float:
        limits = httpx.Limits(max_connections=concurrency)
        verify: ssl.SSLContext | bool = True
        if sink.ca_pem is not None:
            verify = ssl.create_default_context(cadata=sink.ca_pem)
        async with httpx.AsyncClient(limits=limits, trust_env=False, verify=verify) as client:
            pending = iter(range(n))

            async def poster() -> None:
                for _ in pending:
                    answer = await client.post(sink.url, content=body, headers={
                        "content-type": "application/json"})
                    answer.raise_for_status()

            started = time.perf_counter()
            await asyncio.gather(*(poster() for _ in range(concurrency)))
            return n / (time.perf_counter() - started)

    return asyncio.run(post_all())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--https", action="store_true",
                        help="the receiver over HTTPS, its CA the endpoint's private CA")
    args = parser.parse_args()
    cpu: dict[str, float] = {}
    with bench_database() as bench, http_sink(args.https) as sink:
        print(f"server: {bench.server}; {args.deliveries:,} deliveries over "
              f"{'HTTPS' if args.https else 'HTTP'}, worker concurrency {args.concurrency}, "
              f"{os.cpu_count()} cores")
        ours = delivery_rate(bench, sink, args.deliveries, args.concurrency, cpu)
        baseline = baseline_rate(sink, args.deliveries, args.concurrency)
    print_table([Row("webhook deliveries", rate(ours), rate(baseline), ratio(ours, baseline))])
    per = {name: spent / args.deliveries * 1e6 for name, spent in cpu.items()}
    print("CPU per delivery: " + ", ".join(f"{name} {us:,.0f} µs"
                                            for name, us in sorted(per.items())))


if __name__ == "__main__":
    main()
