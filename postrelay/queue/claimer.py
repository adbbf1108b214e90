"""The claim loop's own connection, held for the worker's life (see heldconn.py).

A worker woken by NOTIFY claims at once; checking a connection out of the pool for every
claim would add a pool round and greenlet switches to the pickup latency of every job.

On a direct connection the settings below are the session's own: the connection serves
the claim loop alone and is closed, never pooled, when it is let go. Behind a transaction
pooler each claim sets them for its own transaction instead (`local_settings`;
job_claim_local_settings in sql/claim.sql), in the same round trip: that costs a pipeline
and a statement in every claim, which the direct path is spared.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from postrelay.core.heldconn import HeldConnection

# The claim connection's own session settings:
# - plan_cache_mode = force_generic_plan: the claim runs on every wake-up, and planning it
#   afresh would add server time to every pickup's latency. Its plan does not depend on
#   estimates (sql/claim.sql, job_claim). The worker's engine forces custom plans for the
#   sake of job_finalize_many.
# - synchronous_commit = off: a claim does not wait for its WAL to reach disk. Should the
#   server crash before that, the claim is forgotten and the job is pending again, to run
#   once more, as after any crash mid-job; any later durable commit (the job's outcome, an
#   email's `sending` row) flushes the claim with it. Waiting for the flush would add to
#   every pickup's latency.
# - enable_sort and enable_bitmapscan off: the claim always walks ix_job_dispatch in
#   (priority, available_at) order and stops at LIMIT. When a burst of jobs arrives faster
#   than autovacuum analyzes the table, stale statistics promise a handful of pending rows
#   and the planner picks a bitmap scan that sorts every pending row on every claim
#   (bench/burst_bench.py measures it).
# - jit = off: with enable_sort off, the few rows fair claiming sorts (job_claim_fair's
#   shares, at most one per tenant in the claim) cost the planner's "disabled" penalty,
#   which is far past jit_above_cost, and compiling the statement would cost more than
#   running it many times over.
_SESSION = (
    text("SET plan_cache_mode = force_generic_plan"),
    text("SET synchronous_commit = off"),
    text("SET enable_sort = off"),
    text("SET enable_bitmapscan = off"),
    text("SET jit = off"),
)


class ClaimConnection(HeldConnection):
    """The claim loop's held connection, with the session settings above."""

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine, _SESSION)
        # Behind a transaction pooler: pass to queries.job_claim, which sets them per claim.
        self.local_settings = self.pooled
