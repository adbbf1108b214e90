-- The claims: plain and shared out across tenants, and when the next job falls due; the
-- claim within rate and concurrency limits is in limited.sql. Loaded with job.sql into
-- JOB_SQL (queue/queries.py).

-- name: job_claim
-- One statement claims a whole batch. The MATERIALIZED CTE is the fence that matters:
-- without it the planner may fold the subquery into the UPDATE and lock more rows than
-- LIMIT asks for, or re-evaluate it. SKIP LOCKED lets concurrent workers pass each other's
-- rows instead of queueing behind them. The kind filter compares the enum column itself
-- (not its text), so the planner can estimate it and keep to ix_job_dispatch; the worker
-- passes only kinds the enum has. The UPDATE finds the claimed rows by primary key from
-- an array, never by a join: a generic plan reckons LIMIT as a tenth of the table and
-- joined a hash of every row in it, so a claim grew with the table, while this shape
-- is the same plan whatever the estimates, so the claim connection plans it once
-- (queue/claimer.py). Its rows come back in key order; the worker sorts them.
-- With :fair (fair claiming on), the claim is made only when no other tenant has due work
-- at the priority level of its most urgent job (the `seed`'s): two probes of ix_job_fair,
-- one either side of the seed's tenant. Otherwise it claims nothing and the worker shares
-- the claim out with job_claim_fair, whose extra work a claim thus pays only when there is
-- something to share. Without :fair, the probes never run (an InitPlan runs when first
-- needed, and the OR is decided before).
WITH candidate AS MATERIALIZED (
    SELECT id, priority, available_at, tenant_id
    FROM mdm.aa_job
    WHERE status = 'pending'
      AND available_at <= now()
      AND (CAST(:tenant_ids AS uuid[]) IS NULL OR tenant_id = ANY(CAST(:tenant_ids AS uuid[])))
      AND (CAST(:kinds AS mdm.job_kind[]) IS NULL
           OR job_kind = ANY(CAST(:kinds AS mdm.job_kind[])))
      -- Pauses (sql/pauses.sql). The uncorrelated EXISTS is an InitPlan, run once per claim:
      -- with nothing paused, the usual case, the rows pay nothing for it; with a pause,
      -- each row examined probes the few rows of aa_job_pause.
      AND (NOT EXISTS (SELECT FROM mdm.aa_job_pause)
           OR NOT EXISTS (SELECT FROM mdm.aa_job_pause p
                          WHERE (p.tenant_id IS NULL OR p.tenant_id = aa_job.tenant_id)
                            AND (p.job_kind IS NULL OR p.job_kind = aa_job.job_kind)))
    ORDER BY priority, available_at
    LIMIT :demand
    FOR UPDATE SKIP LOCKED
), seed AS MATERIALIZED (
    SELECT priority, tenant_id FROM candidate ORDER BY priority, available_at LIMIT 1
)
UPDATE mdm.aa_job j
SET status = 'running', claimed_by = :worker, claimed_at = now(), attempts = j.attempts + 1
WHERE j.id = ANY(ARRAY(SELECT id FROM candidate))
  AND (NOT CAST(:fair AS boolean) OR NOT EXISTS (
      SELECT FROM seed s CROSS JOIN LATERAL (
          (SELECT FROM mdm.aa_job o
           WHERE o.status = 'pending' AND o.priority = s.priority
             AND o.tenant_id < s.tenant_id AND o.available_at <= now()
             AND (CAST(:tenant_ids AS uuid[]) IS NULL
                  OR o.tenant_id = ANY(CAST(:tenant_ids AS uuid[])))
             AND (CAST(:kinds AS mdm.job_kind[]) IS NULL
                  OR o.job_kind = ANY(CAST(:kinds AS mdm.job_kind[])))
             AND (NOT EXISTS (SELECT FROM mdm.aa_job_pause)
                  OR NOT EXISTS (SELECT FROM mdm.aa_job_pause p
                                 WHERE (p.tenant_id IS NULL OR p.tenant_id = o.tenant_id)
                                   AND (p.job_kind IS NULL OR p.job_kind = o.job_kind)))
           ORDER BY o.tenant_id DESC
           LIMIT 1)
          UNION ALL
          (SELECT FROM mdm.aa_job o
           WHERE o.status = 'pending' AND o.priority = s.priority
             AND o.tenant_id > s.tenant_id AND o.available_at <= now()
             AND (CAST(:tenant_ids AS uuid[]) IS NULL
                  OR o.tenant_id = ANY(CAST(:tenant_ids AS uuid[])))
             AND (CAST(:kinds AS mdm.job_kind[]) IS NULL
                  OR o.job_kind = ANY(CAST(:kinds AS mdm.job_kind[])))
             AND (NOT EXISTS (SELECT FROM mdm.aa_job_pause)
                  OR NOT EXISTS (SELECT FROM mdm.aa_job_pause p
                                 WHERE (p.tenant_id IS NULL OR p.tenant_id = o.tenant_id)
                                   AND (p.job_kind IS NULL OR p.job_kind = o.job_kind)))
           ORDER BY o.tenant_id
           LIMIT 1)
      ) other))
-- The payload comes as JSON text, which the worker decodes for half what psycopg's jsonb
-- loader costs.
RETURNING j.id, j.tenant_id, j.job_kind::text AS kind, CAST(j.payload AS text) AS payload,
          j.priority, j.attempts, j.max_attempts,
          -- Times Python has no datetime for, SQL by hand can write: a due time at '-infinity'
          -- (or BC: due at once) reads as the job's creation, and a creation at either
          -- infinity (or past year 9999, or BC) as the latest or earliest datetime Python
          -- has, as the listings read it (core/timestamps.py); raised, it failed the claim.
          CASE WHEN j.available_at >= TIMESTAMPTZ '0001-01-01 00:00:00+00'
                    AND j.available_at < TIMESTAMPTZ '10000-01-01 00:00:00+00'
               THEN j.available_at
               ELSE LEAST(GREATEST(j.created_at, TIMESTAMPTZ '0001-01-01 00:00:00+00'),
                          TIMESTAMPTZ '9999-12-31 23:59:59.999999+00') END,
          j.claimed_at,
          LEAST(GREATEST(j.created_at, TIMESTAMPTZ '0001-01-01 00:00:00+00'),
                TIMESTAMPTZ '9999-12-31 23:59:59.999999+00'),
          j.idempotency_key;

-- name: job_claim_fair
-- job_claim with the claim shared out across tenants (POSTRELAY_FAIR_CLAIMING, on by
-- default). `plain` is job_claim's own choice: the :demand most urgent due jobs, whoever's.
-- Its first job names the priority level to share (priority comes first) and the `seed`
-- tenant, the owner of the oldest due job there. `walk` then skips through ix_job_fair
-- (priority, tenant_id, available_at), one index probe per tenant, to other tenants with
-- due work at that level, round from :start (the worker passes where its last claim's
-- round ended, queries.next_fair_start), so that when more tenants wait than a claim has
-- jobs each claim serves the next stretch of them; at most :demand tenants, the seed
-- among them if the round reaches it. Each other tenant's share is its
-- weight's part of :demand (:weight_tenants / :weights; 1 when not named), at least one,
-- filled with its oldest due jobs (`picks`); the rest of the claim is `plain`'s jobs in
-- order, so what a tenant with fewer jobs than its share leaves goes by priority and due
-- time, and no slot idles while work waits. With one tenant this is job_claim plus a few
-- index probes that find no other tenant: the one walk through the index past the jobs
-- claimed just before (dead until vacuumed) is `plain`'s. `plain` rows left out stay
-- locked until the statement ends (at most :demand). The filters, the pause check, the
-- fences and the UPDATE by primary key are job_claim's, for its reasons.
WITH RECURSIVE plain AS MATERIALIZED (
    SELECT id, priority, available_at, tenant_id
    FROM mdm.aa_job
    WHERE status = 'pending'
      AND available_at <= now()
      AND (CAST(:tenant_ids AS uuid[]) IS NULL OR tenant_id = ANY(CAST(:tenant_ids AS uuid[])))
      AND (CAST(:kinds AS mdm.job_kind[]) IS NULL
           OR job_kind = ANY(CAST(:kinds AS mdm.job_kind[])))
      AND (NOT EXISTS (SELECT FROM mdm.aa_job_pause)
           OR NOT EXISTS (SELECT FROM mdm.aa_job_pause p
                          WHERE (p.tenant_id IS NULL OR p.tenant_id = aa_job.tenant_id)
                            AND (p.job_kind IS NULL OR p.job_kind = aa_job.job_kind)))
    ORDER BY priority, available_at
    LIMIT :demand
    FOR UPDATE SKIP LOCKED
), seed AS MATERIALIZED (
    SELECT priority, tenant_id FROM plain ORDER BY priority, available_at LIMIT 1
), walk (tenant_id, lap, n) AS (
    -- From :start down, then from the highest id down to it: lap 0, lap 1.
    -- Downwards, because each probe then lands on a tenant's newest jobs: its oldest, at
    -- the front of its stretch of the index, are those claimed just before, whose entries
    -- stay until vacuum and would be walked past. The bounds on tenant_id are plain
    -- comparisons, so each step is one index probe; of each UNION ALL ... LIMIT 1 the
    -- second branch runs only when the first finds none. The seed may turn up: it is
    -- left out of the shares below.
    SELECT first.tenant_id, first.lap, 1
    FROM seed s CROSS JOIN LATERAL (
        (SELECT tenant_id, 0 AS lap FROM mdm.aa_job
         WHERE status = 'pending' AND priority = s.priority
           AND tenant_id < CAST(:start AS uuid)
           AND available_at <= now()
           AND (CAST(:tenant_ids AS uuid[]) IS NULL
                OR tenant_id = ANY(CAST(:tenant_ids AS uuid[])))
           AND (CAST(:kinds AS mdm.job_kind[]) IS NULL
                OR job_kind = ANY(CAST(:kinds AS mdm.job_kind[])))
           AND (NOT EXISTS (SELECT FROM mdm.aa_job_pause)
                OR NOT EXISTS (SELECT FROM mdm.aa_job_pause p
                               WHERE (p.tenant_id IS NULL OR p.tenant_id = aa_job.tenant_id)
                                 AND (p.job_kind IS NULL OR p.job_kind = aa_job.job_kind)))
         ORDER BY tenant_id DESC
         LIMIT 1)
        UNION ALL
        (SELECT tenant_id, 1 AS lap FROM mdm.aa_job
         WHERE status = 'pending' AND priority = s.priority
           AND tenant_id >= CAST(:start AS uuid)
           AND available_at <= now()
           AND (CAST(:tenant_ids AS uuid[]) IS NULL
                OR tenant_id = ANY(CAST(:tenant_ids AS uuid[])))
           AND (CAST(:kinds AS mdm.job_kind[]) IS NULL
                OR job_kind = ANY(CAST(:kinds AS mdm.job_kind[])))
           AND (NOT EXISTS (SELECT FROM mdm.aa_job_pause)
                OR NOT EXISTS (SELECT FROM mdm.aa_job_pause p
                               WHERE (p.tenant_id IS NULL OR p.tenant_id = aa_job.tenant_id)
                                 AND (p.job_kind IS NULL OR p.job_kind = aa_job.job_kind)))
         ORDER BY tenant_id DESC
         LIMIT 1)
        LIMIT 1
    ) first
    UNION ALL
    SELECT next.tenant_id, next.lap, w.n + 1
    FROM walk w CROSS JOIN seed s CROSS JOIN LATERAL (
        (SELECT tenant_id, w.lap AS lap FROM mdm.aa_job
         WHERE status = 'pending' AND priority = s.priority
           AND tenant_id < w.tenant_id
           AND tenant_id >= CASE WHEN w.lap = 0
                                 THEN CAST('00000000-0000-0000-0000-000000000000' AS uuid)
                                 ELSE CAST(:start AS uuid) END
           AND available_at <= now()
           AND (CAST(:tenant_ids AS uuid[]) IS NULL
                OR tenant_id = ANY(CAST(:tenant_ids AS uuid[])))
           AND (CAST(:kinds AS mdm.job_kind[]) IS NULL
                OR job_kind = ANY(CAST(:kinds AS mdm.job_kind[])))
           AND (NOT EXISTS (SELECT FROM mdm.aa_job_pause)
                OR NOT EXISTS (SELECT FROM mdm.aa_job_pause p
                               WHERE (p.tenant_id IS NULL OR p.tenant_id = aa_job.tenant_id)
                                 AND (p.job_kind IS NULL OR p.job_kind = aa_job.job_kind)))
         ORDER BY tenant_id DESC
         LIMIT 1)
        UNION ALL
        (SELECT tenant_id, 1 AS lap FROM mdm.aa_job
         WHERE w.lap = 0 AND status = 'pending' AND priority = s.priority
           AND tenant_id >= CAST(:start AS uuid)
           AND available_at <= now()
           AND (CAST(:tenant_ids AS uuid[]) IS NULL
                OR tenant_id = ANY(CAST(:tenant_ids AS uuid[])))
           AND (CAST(:kinds AS mdm.job_kind[]) IS NULL
                OR job_kind = ANY(CAST(:kinds AS mdm.job_kind[])))
           AND (NOT EXISTS (SELECT FROM mdm.aa_job_pause)
                OR NOT EXISTS (SELECT FROM mdm.aa_job_pause p
                               WHERE (p.tenant_id IS NULL OR p.tenant_id = aa_job.tenant_id)
                                 AND (p.job_kind IS NULL OR p.job_kind = aa_job.job_kind)))
         ORDER BY tenant_id DESC
         LIMIT 1)
        LIMIT 1
    ) next
    WHERE w.n < :demand
), weighted AS MATERIALIZED (
    -- The tenants sharing this claim: the seed (n = 0) and the others the walk found.
    SELECT t.tenant_id, t.n,
           COALESCE((SELECT x.weight
                     FROM unnest(CAST(:weight_tenants AS uuid[]), CAST(:weights AS integer[]))
                          AS x (tenant_id, weight)
                     WHERE x.tenant_id = t.tenant_id), 1) AS weight
    FROM (SELECT tenant_id, 0 AS n FROM seed
          UNION ALL
          SELECT w.tenant_id, w.n FROM walk w
          WHERE w.tenant_id <> (SELECT tenant_id FROM seed)) AS t
), shares AS MATERIALIZED (
    -- The other tenants' shares in walk order, cut where they reach :demand. The seed's
    -- share is what they leave, taken from `plain`.
    SELECT tenant_id,
           LEAST(share, :demand - COALESCE(sum(share) OVER (ORDER BY n ROWS BETWEEN
                                                            UNBOUNDED PRECEDING
                                                            AND 1 PRECEDING), 0)) AS share
    FROM (SELECT tenant_id, n,
                 GREATEST(1, floor(:demand * weight / sum(weight) OVER ()))::integer AS share
          FROM weighted) AS s
    WHERE n > 0
), picks AS MATERIALIZED (
    SELECT j.id, j.priority, j.available_at
    FROM shares c CROSS JOIN seed s CROSS JOIN LATERAL (
        SELECT id, priority, available_at FROM mdm.aa_job
        WHERE status = 'pending' AND priority = s.priority AND tenant_id = c.tenant_id
          AND available_at <= now()
          AND (CAST(:kinds AS mdm.job_kind[]) IS NULL
               OR job_kind = ANY(CAST(:kinds AS mdm.job_kind[])))
          AND (NOT EXISTS (SELECT FROM mdm.aa_job_pause)
               OR NOT EXISTS (SELECT FROM mdm.aa_job_pause p
                              WHERE (p.tenant_id IS NULL OR p.tenant_id = aa_job.tenant_id)
                                AND (p.job_kind IS NULL OR p.job_kind = aa_job.job_kind)))
        ORDER BY available_at
        LIMIT c.share
        FOR UPDATE SKIP LOCKED
    ) j
    WHERE c.share > 0
), rest AS MATERIALIZED (
    SELECT id FROM plain
    WHERE id <> ALL(ARRAY(SELECT id FROM picks))
    ORDER BY priority, available_at
    LIMIT (SELECT :demand - count(*) FROM picks)
)
UPDATE mdm.aa_job j
SET status = 'running', claimed_by = :worker, claimed_at = now(), attempts = j.attempts + 1
WHERE j.id = ANY(ARRAY(SELECT id FROM picks UNION ALL SELECT id FROM rest))
RETURNING j.id, j.tenant_id, j.job_kind::text AS kind, CAST(j.payload AS text) AS payload,
          j.priority, j.attempts, j.max_attempts,
          -- Times Python has no datetime for, SQL by hand can write: a due time at '-infinity'
          -- (or BC: due at once) reads as the job's creation, and a creation at either
          -- infinity (or past year 9999, or BC) as the latest or earliest datetime Python
          -- has, as the listings read it (core/timestamps.py); raised, it failed the claim.
          CASE WHEN j.available_at >= TIMESTAMPTZ '0001-01-01 00:00:00+00'
                    AND j.available_at < TIMESTAMPTZ '10000-01-01 00:00:00+00'
               THEN j.available_at
               ELSE LEAST(GREATEST(j.created_at, TIMESTAMPTZ '0001-01-01 00:00:00+00'),
                          TIMESTAMPTZ '9999-12-31 23:59:59.999999+00') END,
          j.claimed_at,
          LEAST(GREATEST(j.created_at, TIMESTAMPTZ '0001-01-01 00:00:00+00'),
                TIMESTAMPTZ '9999-12-31 23:59:59.999999+00'),
          j.idempotency_key;

-- name: job_claim_local_settings
-- The claim connection's settings (queue/claimer.py says why each is there) for one claim's
-- transaction only: behind a transaction pooler a session setting would stay on a server
-- connection that other clients use next (synchronous_commit = off would make their
-- commits non-durable). Sent ahead of job_claim in the same round trip and the same
-- implicit transaction (queries.job_claim). No plan_cache_mode: nothing is prepared there.
SELECT set_config('synchronous_commit', 'off', true),
       set_config('enable_sort', 'off', true),
       set_config('enable_bitmapscan', 'off', true),
       set_config('jit', 'off', true);

-- name: job_next_due_in
-- Seconds until the next pending job becomes due (negative: already due; NULL: none), so
-- an idle worker wakes exactly then instead of a poll interval later. Paused jobs do not
-- count: a due but paused job would have the worker claim nothing in a tight loop; a
-- resume wakes it (NOTIFY), or its poll does.
-- Jobs at an infinite available_at (SQL written by hand: 'infinity' parks a job for good)
-- are left out: the subtraction failed, and with it every idle worker's claim. One at
-- '-infinity' is due, so the claim before this takes it.
SELECT EXTRACT(EPOCH FROM min(available_at) FILTER (WHERE isfinite(available_at))
                          - clock_timestamp())::float8 AS due_in
FROM mdm.aa_job
WHERE status = 'pending'
  AND (CAST(:tenant_ids AS uuid[]) IS NULL OR tenant_id = ANY(CAST(:tenant_ids AS uuid[])))
  AND (CAST(:kinds AS mdm.job_kind[]) IS NULL
       OR job_kind = ANY(CAST(:kinds AS mdm.job_kind[])))
  AND (NOT EXISTS (SELECT FROM mdm.aa_job_pause)
       OR NOT EXISTS (SELECT FROM mdm.aa_job_pause p
                      WHERE (p.tenant_id IS NULL OR p.tenant_id = aa_job.tenant_id)
                        AND (p.job_kind IS NULL OR p.job_kind = aa_job.job_kind)));
