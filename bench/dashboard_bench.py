"""Time the dashboard's overview with a million jobs in the table: each statement it runs,
the whole overview read, and the page itself over real HTTP (uvicorn on loopback, signed in
with the service-role key), plus the other pages once each filter shape.

    POSTRELAY_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test \\
        .venv/bin/python -m bench.dashboard_bench
    .venv/bin/python -m bench.dashboard_bench --jobs 200000 --rounds 20   # quicker
    .venv/bin/python -m bench.dashboard_bench --explain          # print the query plans

Runs against POSTRELAY_DATABASE_URL's server when it is set, else the embedded PostgreSQL;
either way in a database created for the run and dropped at the end (bench/harness.py).
The data is made with INSERT … SELECT generate_series (about 30 s for a million jobs),
then VACUUM ANALYZE, as autovacuum would leave a table in steady state.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import secrets
import signal
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine

from bench.harness import BenchDatabase, bench_database
from postrelay.core.db import sqlalchemy_url
from postrelay.dashboard import queries
from postrelay.dashboard.queries import DASHBOARD_SQL
from postrelay.orchestrator import EmailHourTally
from tests.api.server import serve_database

TARGET_MS = 200.0
FILL = """
INSERT INTO mdm.aa_tenant (name)
SELECT 'tenant-' || lpad(g::text, 3, '0') FROM generate_series(1, :tenants) g;
SELECT setseed(0.42);
-- Jobs: a few big tenants and many small ones; 90 % done over the 14 days of retention,
-- the live ones (pending, running) from the last ten minutes, 2 % failed, 2 % dead.
INSERT INTO mdm.aa_job (tenant_id, job_kind, status, payload, available_at, attempts,
    max_attempts, last_error, claimed_by, claimed_at, completed_at, idempotency_key, created_at)
SELECT t.ids[1 + floor(array_length(t.ids, 1) * x.r2 * x.r2)::int],
       k.kinds[1 + floor(array_length(k.kinds, 1) * power(x.r3, 1.5))::int],
       s.status, jsonb_build_object('n', g, 'to', 'user' || g || '@example.com'),
       CASE WHEN s.status = 'pending' AND x.r5 < 0.3 THEN now() + x.r5 * interval '1 hour'
            ELSE c.created_at END,
       CASE WHEN s.status IN ('failed', 'dlq') THEN 8 WHEN s.status = 'pending' THEN 0 ELSE 1 END,
       8,
       CASE WHEN s.status IN ('failed', 'dlq')
            THEN 'Traceback (most recent call last): ConnectionError: upstream ' || g END,
       CASE WHEN s.status = 'running' THEN 'bench-worker' END,
       CASE WHEN s.status <> 'pending' THEN c.created_at + interval '1 second' END,
       CASE WHEN s.status IN ('done', 'failed', 'dlq')
            THEN c.created_at + (1 + 5 * x.r5) * interval '1 second' END,
       CASE WHEN x.r5 < 0.4 THEN 'bench-' || g END,
       c.created_at
FROM generate_series(1, :jobs) g
CROSS JOIN (SELECT array_agg(id ORDER BY name) AS ids FROM mdm.aa_tenant) t
CROSS JOIN (SELECT enum_range(NULL::mdm.job_kind) AS kinds) k
CROSS JOIN LATERAL (SELECT random() AS r1, random() AS r2, random() AS r3, random() AS r4,
                           random() AS r5 WHERE g > 0) x
CROSS JOIN LATERAL (SELECT CAST(CASE WHEN x.r1 < 0.90 THEN 'done' WHEN x.r1 < 0.95 THEN 'pending'
                                     WHEN x.r1 < 0.96 THEN 'running' WHEN x.r1 < 0.98 THEN 'failed'
                                     ELSE 'dlq' END AS mdm.job_status) AS status) s
CROSS JOIN LATERAL (SELECT now() - x.r4 * CASE WHEN s.status IN ('pending', 'running')
                                               THEN interval '10 minutes'
                                               ELSE interval '14 days' END AS created_at) c;
-- Outbox: a week of events, 97 % relayed, 2 % waiting, 1 % dead.
INSERT INTO mdm.aa_outbox_event (tenant_id, aggregate_type, aggregate_id, event_type, payload,
    created_at, handled_at, jobs_created, attempts, available_at, last_error, dead_at)
SELECT t.ids[1 + floor(array_length(t.ids, 1) * x.r2 * x.r2)::int], 'order', (g % 50000)::text,
       'order.placed', jsonb_build_object('n', g), c.created_at,
       CASE WHEN x.r1 < 0.97 THEN c.created_at + interval '50 ms' END,
       CASE WHEN x.r1 < 0.97 THEN 1 END,
       CASE WHEN x.r1 >= 0.99 THEN 10 ELSE 0 END, c.created_at,
       CASE WHEN x.r1 >= 0.99 THEN 'KeyError: ''customer''' END,
       CASE WHEN x.r1 >= 0.99 THEN c.created_at + interval '10 minutes' END
FROM generate_series(1, :events) g
CROSS JOIN (SELECT array_agg(id ORDER BY name) AS ids FROM mdm.aa_tenant) t
CROSS JOIN LATERAL (SELECT random() AS r1, random() AS r2, random() AS r3 WHERE g > 0) x
CROSS JOIN LATERAL (SELECT now() - CASE WHEN x.r1 BETWEEN 0.97 AND 0.99
                                        THEN x.r3 * interval '2 minutes'
                                        ELSE x.r3 * interval '7 days' END AS created_at) c;
-- Email log: a week of attempts, mostly sent; of those sent, 2 % bounced later and 0.1 %
-- drew a complaint, as feedback would have said.
INSERT INTO mdm.aa_email_log (tenant_id, template, from_address, recipients, to_addresses,
    subject, message_id, status, smtp_code, smtp_response, attempt, created_at, finished_at,
    delivery)
SELECT t.ids[1 + floor(array_length(t.ids, 1) * x.r2 * x.r2)::int],
       (ARRAY['welcome', 'receipt', 'password-reset', 'digest'])[1 + floor(4 * x.r3)::int],
       'noreply@example.com', ARRAY['user' || g || '@example.com'],
       ARRAY['user' || g || '@example.com'], 'Your receipt #' || g, '<' || g || '@bench>',
       CASE WHEN x.r1 < 0.85 THEN 'sent' WHEN x.r1 < 0.90 THEN 'deferred'
            WHEN x.r1 < 0.94 THEN 'bounced' WHEN x.r1 < 0.96 THEN 'failed'
            WHEN x.r1 < 0.98 THEN 'suppressed' WHEN x.r1 < 0.99 THEN 'partial'
            WHEN x.r1 < 0.995 THEN 'unknown' ELSE 'sending' END,
       250, '250 2.0.0 Ok: queued', 1, c.created_at, c.created_at + interval '80 ms',
       CASE WHEN x.r1 < 0.85 AND x.r5 < 0.02 THEN 'bounced'
            WHEN x.r1 < 0.85 AND x.r5 < 0.021 THEN 'complained' END
FROM generate_series(1, :emails) g
CROSS JOIN (SELECT array_agg(id ORDER BY name) AS ids FROM mdm.aa_tenant) t
CROSS JOIN LATERAL (SELECT random() AS r1, random() AS r2, random() AS r3, random() AS r4,
                           random() AS r5
                    WHERE g > 0) x
CROSS JOIN LATERAL (SELECT now() - x.r4 * interval '7 days' AS created_at) c
"""


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    with bench_database() as bench:
        _progress(f"filling: {args.jobs:,} jobs, {args.events:,} outbox events, "
                  f"{args.emails:,} email log rows, {args.tenants} tenants")
        _fill(bench, args)
        print(f"postrelay dashboard benchmark: {args.jobs:,} jobs, {args.events:,} outbox "
              f"events, {args.emails:,} email log rows, {args.tenants} tenants; "
              f"{args.rounds} rounds after {args.warmup} warm-up; {bench.server}")
        _measure(bench, args, "migrated schema")
    print(f"\n{time.monotonic() - started:.0f} s")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=200_000, help="outbox events")
    parser.add_argument("--emails", type=int, default=300_000, help="email log rows")
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=40, help="timed requests per figure")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--explain", action="store_true",
                        help="print EXPLAIN (ANALYZE, BUFFERS) of the overview's statements")
    return parser.parse_args(argv)


_STARTED = time.monotonic()


def _progress(message: str) -> None:
    print(f"  [{time.monotonic() - _STARTED:4.0f} s] {message}", file=sys.stderr, flush=True)


def _fill(bench: BenchDatabase, args: argparse.Namespace) -> None:
    params = {"tenants": args.tenants, "jobs": args.jobs, "events": args.events,
              "emails": args.emails}
    with bench.engine.begin() as conn:
        for statement in FILL.split(";\n"):
            if statement.strip():
                conn.execute(text(statement), params)
    with bench.connect(autocommit=True) as conn:
        for table in ("aa_tenant", "aa_job", "aa_outbox_event", "aa_email_log"):
            conn.execute(f"VACUUM ANALYZE mdm.{table}")  # type: ignore[arg-type]
    asyncio.run(_tally_email_hours(bench))


async def _tally_email_hours(bench: BenchDatabase) -> None:
    """The email hour tally up to its mark, as a running maintenance leader keeps it."""
    engine = create_async_engine(bench.url)
    try:
        tally = EmailHourTally(engine)
        while (await tally.run_once()).hours:
            pass
    finally:
        await engine.dispose()


def _measure(bench: BenchDatabase, args: argparse.Namespace, label: str) -> None:
    # The dashboard's own engine options (see postrelay/dashboard/app.py).
    engine = create_engine(sqlalchemy_url(bench.url), connect_args={
        "options": "-c plan_cache_mode=force_custom_plan -c jit=off"})
    with engine.connect() as conn:
        tenant = conn.execute(text(
            "SELECT tenant_id FROM mdm.aa_job GROUP BY 1 ORDER BY count(*) DESC LIMIT 1"
        )).scalar_one()
    rows: list[tuple[str, list[float], float | None]] = []
    try:
        _progress(f"{label}: the overview's statements")
        rows += _statement_rows(engine, args, None)
        rows.append(("overview read, service role", _time(args, lambda: _overview(engine, None)),
                     None))
        rows.append(("overview read, biggest tenant",
                     _time(args, lambda: _overview(engine, tenant)), None))
        if args.explain:
            _explain(engine)
        _progress(f"{label}: pages over HTTP")
        rows += _http_rows(bench, args)
    finally:
        engine.dispose()
    print(f"\n{label}")
    _print(rows)


def _overview(engine: Engine, tenant: Any) -> None:
    with engine.begin() as conn:
        queries.overview(conn, tenant)


def _statement_params(engine: Engine) -> dict[str, dict[str, Any]]:
    now = datetime.now(UTC)
    with engine.connect() as conn:  # the done rollup's mark, read first as the overview does
        until = conn.execute(DASHBOARD_SQL["job_done_rollup_until"]).scalar_one()
    return {
        "job_count_live": {},
        "job_done_estimate": {},
        "job_pending_oldest": {},
        "job_done_rollup_until": {},
        "job_done_per_minute": {"since": now - timedelta(hours=1), "until": until},
        "job_failed_per_minute": {"since": now - timedelta(hours=1)},
        "outbox_backlog": {},
        "email_log_count_since": {"since": now - timedelta(hours=24),
                                  "statuses": list(queries.EMAIL_STATUSES)},
    }


def _statement_rows(engine: Engine, args: argparse.Namespace,
                    tenant: Any) -> list[tuple[str, list[float], float | None]]:
    rows = []
    for name, params in _statement_params(engine).items():
        bound = {"tenant_id": tenant, **params}

        def run(name: str = name, bound: dict[str, Any] = bound) -> None:
            with engine.connect() as conn:
                conn.execute(DASHBOARD_SQL[name], bound).all()

        rows.append((f"  {name}", _time(args, run), None))
    return rows


def _explain(engine: Engine) -> None:
    for name, params in _statement_params(engine).items():
        with engine.connect() as conn:
            plan = conn.execute(text("EXPLAIN (ANALYZE, BUFFERS) " + DASHBOARD_SQL[name].text),
                                {"tenant_id": None, **params}).scalars().all()
        print(f"\n-- {name}")
        print("\n".join(plan))


def _http_rows(bench: BenchDatabase, args: argparse.Namespace
               ) -> list[tuple[str, list[float], float | None]]:
    key = "bench-" + secrets.token_urlsafe(32)
    rows: list[tuple[str, list[float], float | None]] = []
    # The API app on the bench database, served as the API tests serve it.
    with serve_database(bench.url, key) as url, httpx.Client(base_url=url,
                                                             timeout=60) as client:
        _sign_in(client, key)
        with bench.engine.connect() as conn:
            some = conn.execute(text(
                "SELECT id, idempotency_key FROM mdm.aa_job "
                "WHERE status = 'dlq' AND idempotency_key IS NOT NULL LIMIT 1")).one()
        pages = [
            ("GET /dashboard/ (overview page)", "/dashboard/", TARGET_MS),
            ("GET /dashboard/panels (its refresh)", "/dashboard/panels", TARGET_MS),
            *[(f"GET /dashboard/jobs?status={s}", f"/dashboard/jobs?status={s}", None)
              for s in ("pending", "running", "done", "failed", "dlq")],
            ("GET /dashboard/jobs/{id}", f"/dashboard/jobs/{some.id}", None),
            ("GET /dashboard/jobs?q=<idempotency key>",
             f"/dashboard/jobs?q={some.idempotency_key}", None),
            ("GET /dashboard/dlq", "/dashboard/dlq", None),
            ("GET /dashboard/outbox", "/dashboard/outbox", None),
            ("GET /dashboard/emails", "/dashboard/emails", None),
            ("GET /dashboard/emails?status=bounced", "/dashboard/emails?status=bounced",
             None),
            ("GET /dashboard/cron", "/dashboard/cron", None),
        ]
        for label, path, target in pages:
            def get(path: str = path) -> None:
                response = client.get(path)
                if response.status_code not in (200, 303):
                    raise RuntimeError(f"{path}: HTTP {response.status_code}")
            rounds = args if target else argparse.Namespace(
                rounds=max(args.rounds // 4, 5), warmup=2)
            rows.append((label, _time(rounds, get), target))
    return rows


def _sign_in(client: httpx.Client, key: str) -> None:
    page = client.get("/dashboard/login")
    token = re.search(r'name="csrf" value="([^"]+)"', page.text)
    if token is None:
        raise RuntimeError("no sign-in form")
    answer = client.post("/dashboard/login", data={"csrf": token.group(1), "key": key,
                                                   "next": "/"})
    if answer.status_code != 303:
        raise RuntimeError(f"sign-in refused: HTTP {answer.status_code}")


def _time(args: argparse.Namespace, call: Callable[[], None]) -> list[float]:
    for _ in range(args.warmup):
        call()
    samples = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def _print(rows: list[tuple[str, list[float], float | None]]) -> None:
    lines = [("figure", "p50 ms", "p95 ms", "target", "met")]
    for label, samples, target in rows:
        p50 = statistics.median(samples)
        p95 = statistics.quantiles(samples, n=20)[18] if len(samples) >= 2 else samples[0]
        lines.append((label, f"{p50:.1f}", f"{p95:.1f}",
                      f"p95 < {target:.0f}" if target else "",
                      ("yes" if p95 < target else "NO") if target else ""))
    widths = [max(len(line[i]) for line in lines) for i in range(5)]
    for n, line in enumerate(lines):
        print("  ".join(line[i].rjust(widths[i]) if i in (1, 2) else line[i].ljust(widths[i])
                        for i in range(5)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    main()
