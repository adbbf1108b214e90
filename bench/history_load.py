"""History to measure beside: millions of `done` jobs and email log rows, streamed in with
COPY (text format, generated in chunks so memory stays flat), then VACUUM ANALYZE.

The rows look like what a running installation leaves: random (version 4) ids as the
writers make them, `done` jobs completed over the last `job_days` days (inside the 14-day
job retention, so a cleanup run would keep them), email log rows over the last `email_days`
days, one recipient each, most `sent` and a few `deferred` or `bounced`.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import psycopg

CHUNK = 50_000

JOB_COLUMNS = ("id, tenant_id, job_kind, status, payload, priority, available_at, attempts,"
               " max_attempts, claimed_by, claimed_at, completed_at, created_at")
EMAIL_COLUMNS = ("id, tenant_id, template, template_version, category, from_address,"
                 " recipients, to_addresses, subject, message_id, status, smtp_code,"
                 " smtp_enhanced, smtp_response, queue_id, recipient_results, attempt,"
                 " created_at, finished_at")


def _ids(n: int) -> list[str]:
    """n random uuids as 32 hex digits (PostgreSQL reads them without the hyphens)."""
    raw = os.urandom(16 * n).hex()
    return [raw[i:i + 32] for i in range(0, 32 * n, 32)]


def load_done_jobs(conn: psycopg.Connection[Any], tenant_id: UUID, n: int,
                   *, job_days: float = 13.0) -> None:
    """`n` done `reindex` jobs, completed evenly over the last `job_days` days."""
    step = job_days * 86400 / max(n, 1)
    first = _clock(conn) - job_days * 86400
    with conn.cursor() as cur, cur.copy(
            f"COPY mdm.aa_job ({JOB_COLUMNS}) FROM STDIN") as copy:
        for start in range(0, n, CHUNK):
            count = min(CHUNK, n - start)
            lines = []
            for k, job_id in enumerate(_ids(count), start):
                at = _stamp(first + k * step)
                lines.append(
                    f"{job_id}\t{tenant_id}\treindex\tdone\t{{\"n\": {k}}}\t100\t{at}\t1\t8\t"
                    f"history/0/loader\t{at}\t{at}\t{at}\n")
            copy.write("".join(lines))
    conn.commit()


def load_email_log(conn: psycopg.Connection[Any], tenant_id: UUID, n: int,
                   *, email_days: float = 365.0) -> None:
    """`n` email log rows, created evenly over the last `email_days` days: 98 % sent,
    1 % deferred, 1 % bounced."""
    step = email_days * 86400 / max(n, 1)
    first = _clock(conn) - email_days * 86400
    with conn.cursor() as cur, cur.copy(
            f"COPY mdm.aa_email_log ({EMAIL_COLUMNS}) FROM STDIN") as copy:
        for start in range(0, n, CHUNK):
            count = min(CHUNK, n - start)
            lines = []
            for k, row_id in enumerate(_ids(count), start):
                at = _stamp(first + k * step)
                status, code, enhanced = (("bounced", 550, "5.1.1") if k % 100 == 7 else
                                          ("deferred", 451, "4.3.0") if k % 100 == 3 else
                                          ("sent", 250, "2.0.0"))
                rcpt = f"user{k % 1_000_003}@example.com"
                lines.append(
                    f"{row_id}\t{tenant_id}\twelcome\tv1\ttransactional\tnoreply@example.com\t"
                    f"{{{rcpt}}}\t{{{rcpt}}}\tWelcome, user {k}\t<{row_id}@postrelay>\t"
                    f"{status}\t{code}\t{enhanced}\t{code} {enhanced} queued as {row_id[:10]}\t"
                    f"{row_id[:10]}\t{{\"{rcpt}\": {{\"status\": \"accepted\", \"code\": {code}}}}}"
                    f"\t1\t{at}\t{at}\n")
            copy.write("".join(lines))
    conn.commit()


def _clock(conn: psycopg.Connection[Any]) -> float:
    """The server's now() as a Unix time: the rows' times are reckoned back from it (COPY
    cannot evaluate expressions)."""
    now = conn.execute("SELECT EXTRACT(EPOCH FROM now())::float8").fetchone()[0]  # type: ignore[index]
    conn.commit()
    return float(now)


def _stamp(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat()
