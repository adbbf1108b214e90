"""Print the email layer's throughput for this machine: end to end — outbox event → relay →
`email_send` job → render → SMTP → log row — with one worker process, beside the raw
aiosmtplib rate into the same SMTP sink (10 concurrent reused connections, no database).

    .venv/bin/python -m bench.email_bench [--emails 3000] [--quick]

The sink is a separate process (bench/smtp_sink.py) that accepts everything. Each end-to-end
run starts a relay and a worker (at the worker's default concurrency, then at 50;
`POSTRELAY_SMTP_POOL_SIZE=10`), waits until both are up, emits every event in one
transaction, and times from that commit to the last log row's `finished_at`: every message
was rendered, sent and recorded `sent`. CPU per email is read per process; PostgreSQL's is
the bench server's own processes (bench/cpu.py), so run it on a server no one else is using.

A third figure is the floor under ours: the same worker running jobs that only hand a
prebuilt message to the SMTP pool (bench/email_floor_app.py) — the queue and SMTP alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

import aiosmtplib

from bench.cpu import CpuMeter
from bench.harness import (
    REPO_ROOT,
    WORKER_MAIN,
    BenchDatabase,
    Row,
    WorkerProcess,
    bench_database,
    met,
    prefill,
    print_table,
    rate,
    ratio,
    wait_until,
)
from postrelay.core.settings import Settings
from postrelay.relay import EventSpec, emit_many

RATIO_TARGET = 0.5
# CPU per email end to end that the email layer aims at, by process.
CPU_TARGETS_US = {"postgres": 150, "worker": 500}
DEFAULT_CONCURRENCY = Settings.model_fields["worker_concurrency"].default
CONNECTIONS = 10
APP = "bench.email_app"
FLOOR_APP = "bench.email_floor_app"
TEMPLATES = Path(__file__).parent / "email_templates"


@dataclass(frozen=True)
class Sink:
    port: int
    pid: int


@contextmanager
def sink_process(record: Path | None = None, delay: float = 0.0) -> Iterator[Sink]:
    """bench/smtp_sink.py on a free port; `record` and `delay` are its --record and --delay."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "bench.smtp_sink", str(port)]
    if record is not None:
        argv += ["--record", str(record)]
    if delay:
        argv += ["--delay", str(delay)]
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        yield Sink(port, proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)


def sample_message(n: int) -> bytes:
    message = EmailMessage()
    message["From"] = "Bench <bench@postrelay.example>"
    message["To"] = f"User {n} <user{n}@example.com>"
    message["Subject"] = f"Welcome, User {n}!"
    message["Message-ID"] = f"<bench-{n}@postrelay.example>"
    message.set_content(f"Hello User {n}, welcome aboard.\n")
    return message.as_bytes()


async def raw_rate(sink: Sink, n: int, cpu: dict[str, float] | None = None) -> float:
    """aiosmtplib alone: CONNECTIONS clients, each reused for its share of the messages.
    The CPU seconds of this process (the clients) and of the sink go into `cpu`."""
    messages = [sample_message(i) for i in range(n)]
    port = sink.port

    async def client(share: list[bytes], index: int) -> None:
        smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, start_tls=False)
        await smtp.connect()
        for j, data in enumerate(share):
            await smtp.sendmail("bench@postrelay.example", [f"user{index}-{j}@example.com"], data)
        await smtp.quit()

    meter = CpuMeter({"client": os.getpid(), "sink": sink.pid}, server=False)
    meter.start()
    started = time.perf_counter()
    await asyncio.gather(*(client(messages[i::CONNECTIONS], i) for i in range(CONNECTIONS)))
    elapsed = time.perf_counter() - started
    if cpu is not None:
        cpu.update(meter.stop())
    return n / elapsed


def end_to_end_rate(bench: BenchDatabase, sink: Sink, n: int, concurrency: int,
                    profile: Path | None = None, cpu: dict[str, float] | None = None
                    ) -> float:
    """emails/s end to end; the CPU seconds each process spent on the run go into `cpu`."""
    env = {"POSTRELAY_SMTP_HOST": "127.0.0.1", "POSTRELAY_SMTP_PORT": str(sink.port),
           "POSTRELAY_SMTP_POOL_SIZE": str(CONNECTIONS),
           "POSTRELAY_EMAIL_TEMPLATES_DIR": str(TEMPLATES),
           "POSTRELAY_EMAIL_FROM": "Bench <bench@postrelay.example>"}
    with bench.connect(autocommit=True) as conn:
        conn.execute("TRUNCATE mdm.aa_job, mdm.aa_outbox_event, mdm.aa_outbox_delivery, "
                     "mdm.aa_email_log, mdm.aa_worker")
    relay = WorkerProcess(bench, env=env, argv=["-c", WORKER_MAIN, "relay", "--app", APP])
    worker = WorkerProcess(bench, app=APP, concurrency=concurrency, env=env,
                           profile_out=profile / "email-worker.prof" if profile else None)
    with relay, worker:
        wait_until(lambda: _scalar(bench, "SELECT count(*) FROM mdm.aa_worker") == 1,
                   timeout=60, worker=worker, what="the worker to register")
        time.sleep(1.0)  # the relay's LISTEN connection is up
        assert relay.proc is not None and worker.proc is not None
        meter = bench.cpu_meter({"worker": worker.proc.pid, "relay": relay.proc.pid,
                                 "sink": sink.pid, "bench": os.getpid()})
        meter.start()
        events = [EventSpec("user.signed_up",
                            {"user": {"name": f"User {i}", "email": f"user{i}@example.com"}},
                            bench.tenant_id, "user", i) for i in range(n)]
        with bench.engine.begin() as conn:
            emit_many(conn, events)
            committed = conn.exec_driver_sql("SELECT clock_timestamp()").scalar_one()
        # The run is timed from database timestamps, so a slow poll on one connection
        # costs no accuracy and takes little CPU from the processes being measured.
        with bench.connect(autocommit=True) as watch:
            wait_until(lambda: watch.execute("SELECT count(*) FROM mdm.aa_email_log "
                                             "WHERE status = 'sent'").fetchone()[0] >= n,
                       timeout=600, poll=0.2, worker=worker, what="every message to be sent")
        if cpu is not None:
            cpu.update(meter.stop())
    last = _scalar(bench, "SELECT max(finished_at) FROM mdm.aa_email_log")
    return n / (last - committed).total_seconds()


def floor_rate(bench: BenchDatabase, sink: Sink, n: int, concurrency: int) -> float:
    """`reindex` jobs that only send a prebuilt message through an SmtpPool (email_floor_app):
    the queue and SMTP alone. Timed from the first claim to the last completion."""
    prefill(bench, n)
    env = {"POSTRELAY_SMTP_PORT": str(sink.port)}
    with (WorkerProcess(bench, app=FLOOR_APP, concurrency=concurrency, env=env) as worker,
          bench.connect(autocommit=True) as watch):
        wait_until(lambda: watch.execute("SELECT count(*) FROM mdm.aa_job "
                                         "WHERE status = 'done'").fetchone()[0] >= n,
                   timeout=600, poll=0.2, worker=worker, what="every floor job to be done")
    span = _scalar(bench, "SELECT max(completed_at) - min(claimed_at) FROM mdm.aa_job")
    return n / span.total_seconds()


def _scalar(bench: BenchDatabase, sql: str):  # noqa: ANN202
    with bench.connect() as conn:
        return conn.execute(sql).fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.email_bench")
    parser.add_argument("--emails", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--concurrency", type=int, action="append", default=None,
                        help="the worker's concurrency, once per end-to-end run "
                             f"(default: {DEFAULT_CONCURRENCY}, the worker's default, and 50)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="run the worker under cProfile, writing DIR/email-worker.prof")
    args = parser.parse_args()
    n = args.emails or (1_000 if args.quick else 3_000)
    concurrencies = args.concurrency or [DEFAULT_CONCURRENCY, 50]
    raw_cpu: tuple[dict[str, float], dict[str, float]] = ({}, {})  # before, after
    ours: dict[int, float] = {}
    ours_cpu: dict[int, dict[str, float]] = {c: {} for c in concurrencies}
    with bench_database() as bench, sink_process() as sink:
        print(f"server: {bench.server}; {n:,} emails; one worker, concurrency "
              f"{' and '.join(map(str, concurrencies))}, {CONNECTIONS} SMTP connections",
              flush=True)
        raw_before = asyncio.run(raw_rate(sink, n, raw_cpu[0]))
        for c in concurrencies:
            ours[c] = end_to_end_rate(bench, sink, n, c, args.profile, ours_cpu[c])
        floor = floor_rate(bench, sink, n, max(concurrencies))
        raw_after = asyncio.run(raw_rate(sink, n, raw_cpu[1]))
    raw = max(raw_before, raw_after)  # the better raw run: a busy moment never flatters us
    raw_run_cpu = raw_cpu[0] if raw == raw_before else raw_cpu[1]
    print()
    print_table([
        *(Row(f"emails/s end to end (1 worker, concurrency {c})", rate(ours[c]), rate(raw),
              ratio(ours[c], raw), f">= {RATIO_TARGET}x raw aiosmtplib",
              met(ours[c] >= RATIO_TARGET * raw)) for c in concurrencies),
        Row("  floor: queue + SMTP only", rate(floor), rate(raw), ratio(floor, raw), "-", ""),
    ])
    print()
    print(_cpu_line("raw aiosmtplib (the better run)", raw_run_cpu, n))
    for c in concurrencies:
        print(_cpu_line(f"end to end, concurrency {c}", ours_cpu[c], n))
    best = max(concurrencies, key=lambda c: ours[c])
    for name, budget in CPU_TARGETS_US.items():
        spent = ours_cpu[best].get(name, 0.0) / n * 1e6
        print(f"{name} CPU per email at concurrency {best}: {spent:,.0f} µs "
              f"(target <= {budget} µs: {met(spent <= budget)})")
    print(_witness_line(ours_cpu[best]))


def _witness_line(cpu: dict[str, float]) -> str:
    """The targets' processes against the sink, whose work is the same in every run: its
    CPU per email follows the machine's speed of the moment, so these multiples tell a
    slow minute from a change in our code."""
    sink = cpu.get("sink", 0.0)
    if not sink:
        return "no CPU read for the sink: no multiples of it"
    parts = ", ".join(f"{name} {cpu.get(name, 0.0) / sink:.2f}x" for name in CPU_TARGETS_US)
    return f"the same, as multiples of the sink's CPU per email: {parts}"


def _cpu_line(what: str, cpu: dict[str, float], n: int) -> str:
    """CPU per email by process, largest first, and the throughput the machine's cores
    would allow at that cost if every one of them were busy all the time."""
    total = sum(cpu.values())
    parts = ", ".join(f"{name} {secs / n * 1e6:,.0f} µs"
                      for name, secs in sorted(cpu.items(), key=lambda kv: -kv[1]))
    bound = (os.cpu_count() or 1) * n / total if total else float("nan")
    return (f"CPU per email, {what}: {parts}; {total / n * 1000:.2f} ms in all, at most "
            f"{bound:,.0f} emails/s on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
