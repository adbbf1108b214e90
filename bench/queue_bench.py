"""Print the job queue's figures for this machine: enqueue and drain throughput beside plain
psycopg baselines, and the pickup latency of an idle worker.

    .venv/bin/python -m bench.queue_bench            # about 2-4 minutes
    .venv/bin/python -m bench.queue_bench --quick    # under a minute
    POSTRELAY_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test \\
        .venv/bin/python -m bench.queue_bench --jobs 50000
    .venv/bin/python -m bench.queue_bench --only drain --only latency --pgbouncer

Runs against POSTRELAY_DATABASE_URL's server when it is set, else the embedded PostgreSQL;
either way in a database created for the run and dropped at the end. With --pgbouncer, the
drain and latency sections run a second time with the worker going through a PgBouncer in
transaction mode (started for the run, in front of the same database;
POSTRELAY_POOLER=transaction), beside the direct figures. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.drain_bench import baseline_drain, worker_drain
from bench.enqueue_bench import enqueue_batches, enqueue_one_per_txn
from bench.flow_bench import (
    drain_variants,
    limited_drain_variants,
    pickup_behind_backlog,
    rate_achieved,
    tenants_drain,
)
from bench.harness import BenchDatabase, Row, bench_database, met, print_table, rate, ratio
from bench.latency_bench import pickup_latencies, polling_pickup_latency
from tests.pgbouncer import PgBouncer, pgbouncer

SECTIONS = ("enqueue", "batch", "drain", "latency", "flow")
ENQUEUE_TARGET = 0.9  # x the psycopg baseline
BATCH_TARGET = 50_000  # jobs/s
DRAIN_TARGET = 0.5  # x the batched psycopg baseline, one worker process
P50_TARGET_MS, P99_TARGET_MS = 2.0, 5.0
FAIR_DRAIN_TARGET = 0.95  # x the drain without fair claiming (and x --base-tree's)
FAIR_PICKUP_P99_TARGET_MS = 50.0
LIMIT_RATE, LIMIT_BURST, LIMIT_WORKERS = 500, 50, 4


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    # SIGTERM runs the `finally` blocks too: worker subprocesses stopped, database dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    rows: list[Row] = []
    with bench_database() as bench, _bouncer(bench, args) as bouncer:
        args.pooled_env = None if bouncer is None else {
            "POSTRELAY_DATABASE_URL": bouncer.url, "POSTRELAY_POOLER": "transaction"}
        _print_header(bench, args)
        if "enqueue" in args.only:
            rows += _enqueue_rows(bench, args)
        if "batch" in args.only:
            rows += _batch_rows(bench, args)
        if "drain" in args.only:
            rows += _drain_rows(bench, args)
        if "latency" in args.only:
            rows += _latency_rows(bench, args)
        if "flow" in args.only:
            rows += _flow_rows(bench, args)
    print()
    print_table(rows)
    if args.notes:
        print()
        for note in args.notes:
            print(note)
    print(f"\n{time.monotonic() - started:.0f} s; machine load at end: {_load()}")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.queue_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller runs (under a minute)")
    parser.add_argument("--jobs", type=int, help="jobs per drain (default 20000; --quick 5000)")
    parser.add_argument("--concurrency", default="10,50,100,200",
                        help="worker concurrencies to drain with (default 10,50,100,200)")
    parser.add_argument("--only", action="append", choices=SECTIONS,
                        help="run only this section (repeatable; default all)")
    parser.add_argument("--pgbouncer", action="store_true",
                        help="drain and pick up through PgBouncer too (transaction mode)")
    parser.add_argument("--base-tree", type=Path, metavar="DIR",
                        help="flow: drain also with the postrelay in DIR (another checkout, "
                             "e.g. `git archive` of an older commit) against this database")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="run the drain workers under cProfile, writing DIR/worker-cC.prof")
    args = parser.parse_args(argv)
    args.only = tuple(args.only or SECTIONS)
    args.notes = []  # lines printed under the table
    args.jobs = args.jobs or (5_000 if args.quick else 20_000)
    args.concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    args.single = 600 if args.quick else 2_000  # per variant, one job per transaction
    args.batch_totals = {1_000: 5_000, 10_000: 20_000} if args.quick else {
        1_000: 20_000, 10_000: 50_000}
    args.per_txn_jobs = min(args.jobs, 500 if args.quick else 2_000)
    args.latency_jobs = 100 if args.quick else 300
    args.flow_rounds = 2 if args.quick else 3
    args.flow_tenants = 1_000
    args.flow_backlog = 20_000 if args.quick else 100_000
    args.flow_samples = 100 if args.quick else 250
    return args


_STARTED = time.monotonic()


@contextlib.contextmanager
def _bouncer(bench: BenchDatabase, args: argparse.Namespace) -> Iterator[PgBouncer | None]:
    """A PgBouncer in front of the bench database with --pgbouncer, else None."""
    if not args.pgbouncer:
        yield None
        return
    with (tempfile.TemporaryDirectory(prefix="postrelay-bench-pgbouncer-") as folder,
          pgbouncer(bench.url, Path(folder)) as running):
        yield running


def _progress(message: str) -> None:
    print(f"  [{time.monotonic() - _STARTED:4.0f} s] {message}", file=sys.stderr, flush=True)


def _print_header(bench: BenchDatabase, args: argparse.Namespace) -> None:
    with bench.connect() as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
    print(f"postrelay queue benchmark on {socket.gethostname()}: {os.cpu_count()} CPUs, "
          f"{platform.system()} {platform.release()}, Python {platform.python_version()}")
    print(f"PostgreSQL {version}, {bench.server}")
    print(f"drain: {args.jobs} no-op jobs per run{' (--quick)' if args.quick else ''}")
    if args.pooled_env is not None:
        print(f"PgBouncer {_pgbouncer_version()} in transaction mode, in front of the same "
              "database: POSTRELAY_POOLER=transaction (polling, no LISTEN)")
    print(f"machine load at start: {_load()}")
    sys.stdout.flush()


def _pgbouncer_version() -> str:
    import subprocess

    from tests.pgbouncer import find_pgbouncer

    out = subprocess.run([str(find_pgbouncer()), "--version"], capture_output=True, text=True)
    return out.stdout.split("\n")[0].replace("PgBouncer ", "")


def _load() -> str:
    """Load average, and CPU pressure where the kernel reports it: the figures are only as
    good as the machine was quiet."""
    one, five, _ = os.getloadavg()
    text = f"load average {one:.2f} (1 min), {five:.2f} (5 min)"
    try:
        some = Path("/proc/pressure/cpu").read_text().split("\n")[0].split()
        text += f", CPU pressure {some[1].replace('avg10=', '')}% (10 s)"
    except (OSError, IndexError):
        pass
    return text


def _enqueue_rows(bench: BenchDatabase, args: argparse.Namespace) -> list[Row]:
    _progress(f"enqueue, one job per transaction ({args.single} per variant)")
    r = enqueue_one_per_txn(bench, args.single)
    target = f">= {ENQUEUE_TARGET}x"
    return [
        Row("enqueue, 1 job/txn", rate(r["postrelay"]), rate(r["baseline"]),
            ratio(r["postrelay"], r["baseline"]), target,
            met(r["postrelay"] >= ENQUEUE_TARGET * r["baseline"])),
        Row("enqueue, 1 job/txn, NOTIFY off", rate(r["postrelay_no_notify"]),
            rate(r["baseline"]), ratio(r["postrelay_no_notify"], r["baseline"]), target,
            met(r["postrelay_no_notify"] >= ENQUEUE_TARGET * r["baseline"])),
        Row("  same, vs INSERT via SQLAlchemy", rate(r["postrelay_no_notify"]),
            rate(r["sqlalchemy"]), ratio(r["postrelay_no_notify"], r["sqlalchemy"])),
        # The ceiling for the rows above: the baseline's own INSERT in the same kind of
        # `engine.begin()` block, with nothing of postrelay's in it.
        Row("  INSERT via SQLAlchemy, vs psycopg", rate(r["sqlalchemy"]), rate(r["baseline"]),
            ratio(r["sqlalchemy"], r["baseline"])),
        Row("enqueue, 1 job/txn, psycopg connection", rate(r["psycopg"]), rate(r["baseline"]),
            ratio(r["psycopg"], r["baseline"]), target,
            met(r["psycopg"] >= ENQUEUE_TARGET * r["baseline"])),
    ]


def _batch_rows(bench: BenchDatabase, args: argparse.Namespace) -> list[Row]:
    rows = []
    for batch, total in args.batch_totals.items():
        _progress(f"enqueue_many, {batch} per transaction ({total} jobs)")
        r = enqueue_batches(bench, batch, total)
        rows.append(Row(f"enqueue_many, {batch:,}/txn", rate(r["postrelay"]),
                        rate(r["baseline"]), ratio(r["postrelay"], r["baseline"]),
                        f">= {BATCH_TARGET:,}/s", met(r["postrelay"] >= BATCH_TARGET)))
    return rows


def _drain_rows(bench: BenchDatabase, args: argparse.Namespace) -> list[Row]:
    _progress(f"drain baseline, claim 100 + complete 100 ({args.jobs} jobs)")
    batched = baseline_drain(bench, args.jobs, 100)
    _progress(f"drain baseline, claim 1 + complete 1 ({args.per_txn_jobs} jobs)")
    single = baseline_drain(bench, args.per_txn_jobs, 1)
    # Claiming for free slots alone, a worker's claims carry at most its concurrency: beside
    # the smallest one, the baseline claiming and completing that many per transaction.
    smallest = min(args.concurrencies, default=None)
    if smallest is not None:
        _progress(f"drain baseline, claim {smallest} + complete {smallest} ({args.jobs} jobs)")
        same_batch = baseline_drain(bench, args.jobs, smallest)
    ours = {}
    pooled = {}
    for concurrency in args.concurrencies:
        _progress(f"drain, one worker at concurrency {concurrency} ({args.jobs} jobs)")
        ours[concurrency] = worker_drain(bench, args.jobs, concurrency, profile_dir=args.profile)
        if args.pooled_env is not None:
            _progress(f"drain through PgBouncer, concurrency {concurrency} ({args.jobs} jobs)")
            pooled[concurrency] = worker_drain(bench, args.jobs, concurrency,
                                               env=args.pooled_env)
    # Once more after the workers, keeping the better run: the ratios are then never flattered
    # by a baseline that happened to run while the machine was busy.
    _progress(f"drain baseline again, claim 100 + complete 100 ({args.jobs} jobs)")
    batched = max(batched, baseline_drain(bench, args.jobs, 100), key=lambda d: d.per_sec)
    base = batched.per_sec
    rows = []
    for c, d in ours.items():
        rows.append(Row(f"drain, 1 worker, concurrency {c}", rate(d.per_sec), rate(base),
                        ratio(d.per_sec, base), f">= {DRAIN_TARGET}x",
                        met(d.per_sec >= DRAIN_TARGET * base)))
        if c == smallest:
            rows.append(Row(f"  same, vs psycopg at {c}/txn", rate(d.per_sec),
                            rate(same_batch.per_sec), ratio(d.per_sec, same_batch.per_sec)))
        if c in pooled:
            p = pooled[c].per_sec
            rows.append(Row("  same through PgBouncer, vs direct", rate(p), rate(d.per_sec),
                            ratio(p, d.per_sec)))
    rows.append(Row("drain baseline: psycopg, 100/txn (best of 2)", "-", rate(base), "-",
                    "ref. ~38,000/s"))
    rows.append(Row("drain baseline: psycopg, 1/txn", "-", rate(single.per_sec),
                    ratio(single.per_sec, base), "ref. ~1,400/s"))
    args.notes += [f"drain, concurrency {c}: {d.detail()}" for c, d in ours.items()]
    args.notes += [f"drain through PgBouncer, concurrency {c}: {d.detail()}"
                   for c, d in pooled.items()]
    args.notes.append(f"drain baseline, 100/txn: {batched.detail()}")
    return rows


def _latency_rows(bench: BenchDatabase, args: argparse.Namespace) -> list[Row]:
    _progress(f"pickup latency, one job every 20 ms ({args.latency_jobs} jobs each for "
              "postrelay and the psycopg LISTEN + claim baselines, in turns)")
    ours, floor, async_floor = pickup_latencies(bench, args.latency_jobs,
                                                rounds=2 if args.quick else 3)

    def ms(secs: float) -> str:
        return f"{secs * 1000:.2f} ms"

    pooled_rows = []
    if args.pooled_env is not None:
        _progress(f"pickup latency through PgBouncer, by polling ({args.latency_jobs} jobs)")
        pool = polling_pickup_latency(bench, args.latency_jobs, args.pooled_env,
                                      rounds=2 if args.quick else 3)
        pooled_rows = [
            Row("pickup p50 through PgBouncer (polling), vs direct", ms(pool.p50), ms(ours.p50),
                ratio(pool.p50, ours.p50)),
            Row("pickup p99 through PgBouncer (polling), vs direct", ms(pool.p99), ms(ours.p99),
                ratio(pool.p99, ours.p99)),
        ]
        args.notes.append("through PgBouncer the worker finds new jobs by its poll "
                          "(POSTRELAY_WORKER_POLL_INTERVAL_SECS, 1 s by default), not by NOTIFY")

    return [
        Row("pickup latency p50 (commit -> handler)", ms(ours.p50), ms(floor.p50),
            ratio(ours.p50, floor.p50), f"<= {P50_TARGET_MS:g} ms",
            met(ours.p50 * 1000 <= P50_TARGET_MS)),
        Row("pickup latency p99", ms(ours.p99), ms(floor.p99), ratio(ours.p99, floor.p99),
            f"<= {P99_TARGET_MS:g} ms", met(ours.p99 * 1000 <= P99_TARGET_MS)),
        Row("pickup latency max", ms(ours.max), ms(floor.max)),
        Row("  same, asyncio baseline p50 / p99", ms(ours.p50),
            f"{ms(async_floor.p50)} / {ms(async_floor.p99)}", ratio(ours.p50, async_floor.p50)),
        Row("  same from the INSERT, p50", ms(ours.from_insert_p50), ms(floor.from_insert_p50)),
        *pooled_rows,
    ]


def _flow_rows(bench: BenchDatabase, args: argparse.Namespace) -> list[Row]:
    concurrency = 50
    _progress(f"flow: one tenant's drain, fair claiming off and on"
              f"{' and the base tree' if args.base_tree else ''}, {args.flow_rounds} rounds "
              f"({args.jobs} jobs, concurrency {concurrency})")
    one = drain_variants(bench, args.jobs, concurrency, args.flow_rounds, args.base_tree)
    _progress(f"flow: one tenant's drain with no limit and under one that never binds"
              f"{' and the base tree' if args.base_tree else ''}, {args.flow_rounds} rounds")
    limited = limited_drain_variants(bench, args.jobs, concurrency, args.flow_rounds,
                                     args.base_tree)
    _progress(f"flow: {args.flow_tenants} tenants interleaved, fair off and on "
              f"({args.jobs} jobs)")
    many = tenants_drain(bench, args.jobs, args.flow_tenants, concurrency, args.flow_rounds)
    _progress(f"flow: tenant B's pickup behind {args.flow_backlog} jobs of tenant A "
              f"({args.flow_samples} jobs, one every 20 ms)")
    pickup = pickup_behind_backlog(bench, args.flow_backlog, args.flow_samples, 10)
    _progress(f"flow: the same pickup with no backlog ({args.flow_samples} jobs)")
    idle = pickup_behind_backlog(bench, 0, args.flow_samples, 10)
    secs = 5.0 if args.quick else 10.0
    _progress(f"flow: a limit of {LIMIT_RATE}/s (burst {LIMIT_BURST}) with {LIMIT_WORKERS} "
              f"workers ({secs:g} s measured)")
    achieved = rate_achieved(bench, LIMIT_RATE, LIMIT_BURST, LIMIT_WORKERS, secs)
    fair, unfair = one["fair"].per_sec, one["unfair"].per_sec
    target = f">= {FAIR_DRAIN_TARGET}x"
    rows = [Row(f"drain, fair claiming on, vs off (1 tenant, c{concurrency})", rate(fair),
                rate(unfair), ratio(fair, unfair), target, met(fair >= FAIR_DRAIN_TARGET * unfair))]
    if "base" in one:
        base = one["base"].per_sec
        rows += [Row("  same, vs the base tree's drain", rate(fair), rate(base),
                     ratio(fair, base), target, met(fair >= FAIR_DRAIN_TARGET * base)),
                 Row("  fair claiming off, vs the base tree's", rate(unfair), rate(base),
                     ratio(unfair, base))]
    capped, plain = limited["limited"].per_sec, limited["plain"].per_sec
    rows.append(Row("drain under a limit that never binds, vs no limit", rate(capped),
                    rate(plain), ratio(capped, plain)))
    if "base limited" in limited:
        base_capped = limited["base limited"].per_sec
        rows.append(Row("  same, vs the base tree's under that limit", rate(capped),
                        rate(base_capped), ratio(capped, base_capped)))
    m_fair, m_unfair = many["fair"].per_sec, many["unfair"].per_sec
    rows += [
        Row(f"drain, {args.flow_tenants:,} tenants interleaved, fair vs off", rate(m_fair),
            rate(m_unfair), ratio(m_fair, m_unfair)),
        Row(f"tenant B's claim pickup p50 behind A's {args.flow_backlog:,}, vs no backlog",
            f"{pickup.p50 * 1000:.1f} ms", f"{idle.p50 * 1000:.1f} ms"),
        Row("  same, p99, vs no backlog", f"{pickup.p99 * 1000:.1f} ms",
            f"{idle.p99 * 1000:.1f} ms", "", f"<= {FAIR_PICKUP_P99_TARGET_MS:g} ms",
            met(pickup.p99 * 1000 <= FAIR_PICKUP_P99_TARGET_MS)),
        Row("  same, max, vs no backlog", f"{pickup.max * 1000:.1f} ms",
            f"{idle.max * 1000:.1f} ms"),
        Row(f"rate under a {LIMIT_RATE}/s limit, {LIMIT_WORKERS} workers", rate(
            achieved.per_sec), rate(LIMIT_RATE), ratio(achieved.per_sec, LIMIT_RATE),
            "within 5%", met(abs(achieved.per_sec - LIMIT_RATE) <= 0.05 * LIMIT_RATE)),
        Row("  same, most claims in one second", f"{achieved.busiest_second}",
            f"{LIMIT_RATE + LIMIT_BURST}", "", "<= rate + burst",
            met(achieved.busiest_second <= LIMIT_RATE + LIMIT_BURST)),
    ]
    args.notes += [f"flow drain, {name}: {d.detail()}" for name, d in one.items()]
    args.notes += [f"limited drain, {name}: {d.detail()}" for name, d in limited.items()]
    args.notes += [f"flow drain, {args.flow_tenants} tenants, {name}: {d.detail()}"
                   for name, d in many.items()]
    args.notes.append(f"tenant B's pickup: A's pending backlog {pickup.backlog_before:,} when "
                      f"B's first job came, {pickup.backlog_after:,} after its last")
    return rows


if __name__ == "__main__":
    main()
