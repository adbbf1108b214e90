-- The done rollup: done jobs per closed minute and tenant, tallied once by the maintenance
-- leader (queue/maintenance/rollup.py), so that the dashboard's last hour of done jobs sums
-- at most 60 rows per tenant instead of counting every done job of the hour. Loaded by
-- queue/maintenance/rollup.py.

-- name: job_done_rollup_mark
-- Locks the mark's one row for the round (creating it on the first), and returns it with
-- the round's cutoff: the start of the minute `margin_secs` ago. A minute is tallied only
-- once it ended more than the margin ago, so a completion whose transaction commits late
-- (its completed_at is the transaction's start) is still counted. A second leader racing
-- this one waits here and then reads the mark the first one moved. A leader that stalls
-- inside the round (SIGSTOP, a frozen VM) would keep the lock, and the next leader's round
-- would wait behind it for good, its rescues with it: the round's transaction ends itself
-- once it has been idle for 5 s (its statements follow each other within milliseconds).
INSERT INTO mdm.aa_job_done_rollup (id) VALUES (true)
ON CONFLICT (id) DO UPDATE SET until = mdm.aa_job_done_rollup.until
RETURNING until,
          date_trunc('minute', COALESCE(CAST(:now AS timestamptz), now())
                               - make_interval(secs => CAST(:margin_secs AS float8))) AS cutoff,
          set_config('idle_in_transaction_session_timeout', '5s', true) AS stall_limit;

-- name: job_done_rollup_tally
-- Tallies the done jobs completed in [start, end), whole minutes, through
-- ix_job_done_completed, and moves the mark to `end` in the same transaction. A minute
-- tallied again (the mark cleared by hand) gets its new count, never the sum of both.
WITH tally AS (
    INSERT INTO mdm.aa_job_done_minute (minute, tenant_id, done)
    SELECT date_trunc('minute', completed_at), tenant_id, count(*)
    FROM mdm.aa_job
    WHERE status = 'done'
      AND completed_at >= CAST(:start AS timestamptz)
      AND completed_at < CAST(:end AS timestamptz)
    GROUP BY 1, 2
    ON CONFLICT (minute, tenant_id) DO UPDATE SET done = EXCLUDED.done
    RETURNING done
), marked AS (
    UPDATE mdm.aa_job_done_rollup SET until = CAST(:end AS timestamptz)
)
SELECT CAST(COALESCE(sum(done), 0) AS bigint) AS done FROM tally;

-- name: job_done_minute_delete_before
-- The rollup's retention: a few rows per tenant and minute, by the primary key.
DELETE FROM mdm.aa_job_done_minute WHERE minute < CAST(:before AS timestamptz);
