"""History's cost on a busy machine: two databases side by side, one with empty tables and
one beside N `done` jobs, and the drain and the relay measured on each in turn, A B A B ...

    POSTRELAY_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test \\
        .venv/bin/python -m bench.history_ab --rows 10000000 --pairs 4

bench/history_bench.py measures the empty side first and the full side twenty minutes and
gigabytes of loading later; when other work shares the machine, its load moves between the
two and the ratio measures that. Here each pair of runs is a minute apart, so a ratio per
pair, and their median, say what the history costs. Only done jobs are loaded (the drain
and the relay never read the email log); the figures are history_bench's.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import time
from contextlib import ExitStack

from bench.growth_drain import drain_new
from bench.harness import BenchDatabase, bench_database, reset_queue
from bench.history_bench import relay_rate
from bench.history_load import load_done_jobs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.history_ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000, help="done jobs beside B")
    parser.add_argument("--pairs", type=int, default=4, help="A B pairs of each figure")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--events", type=int, default=20_000, help="events per relay run")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with ExitStack() as stack:
        empty = stack.enter_context(bench_database())
        full = stack.enter_context(bench_database())
        began = time.monotonic()
        with full.connect() as conn:
            load_done_jobs(conn, full.tenant_id, args.rows)
        with full.connect(autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE mdm.aa_job")
            conn.execute("CHECKPOINT")  # the load's dirty pages written before measuring
        print(f"[{time.strftime('%H:%M:%S')}] {args.rows:,} done jobs loaded beside B in"
              f" {time.monotonic() - began:.0f} s", flush=True)
        drains = [(_drain(empty, args.jobs, reset=True), _drain(full, args.jobs))
                  for _ in range(args.pairs)]
        _report("drain, 1 worker, concurrency 10 (jobs/s)", drains)
        relays = [(asyncio.run(relay_rate(empty, args.events)),
                   asyncio.run(relay_rate(full, args.events))) for _ in range(args.pairs)]
        _report("relay, 3 x 500-event batches (events/s)", relays)


def _drain(bench: BenchDatabase, jobs: int, *, reset: bool = False) -> float:
    if reset:
        reset_queue(bench)
    figures = drain_new(bench, jobs, 10)
    print(f"  drain {bench.server.rsplit('/', 1)[-1]}: {figures.per_sec:,.0f} jobs/s, CPU per"
          f" job: server {figures.server_us:.0f} µs, worker {figures.worker_us:.0f} µs",
          flush=True)
    return figures.per_sec


def _report(label: str, pairs: list[tuple[float, float]]) -> None:
    ratios = [b / a for a, b in pairs]
    print(f"\n{label}: A = empty tables, B = beside the history, in run order")
    for n, ((a, b), r) in enumerate(zip(pairs, ratios, strict=True), 1):
        print(f"  pair {n}: A {a:,.0f}  B {b:,.0f}  B/A {r:.2f}x")
    best_a, best_b = max(a for a, _ in pairs), max(b for _, b in pairs)
    print(f"  median B/A {statistics.median(ratios):.2f}x; best A {best_a:,.0f}, best B"
          f" {best_b:,.0f} ({best_b / best_a:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
