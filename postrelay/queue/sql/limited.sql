-- The claim within rate and concurrency limits, and what it needs first: the kinds that have
-- a limit, and the lock that makes limited claims take turns. Loaded with job.sql and
-- claim.sql into JOB_SQL (queue/queries.py).

-- name: job_limit_kinds
-- The kinds that have a limit or a throttled destination (sql/throttles.sql): a worker asks
-- at most once a second, and claims those kinds by job_claim_limited only. A throttle whose
-- time is up no longer counts, so its kind goes back to job_claim on time.
SELECT job_kind::text AS kind FROM mdm.aa_job_limit
UNION
SELECT job_kind::text FROM mdm.aa_job_throttle WHERE ends_at > now();

-- name: job_limit_lock
-- The first statement of a limited claim's transaction: the limits of the kinds it claims,
-- then their live throttles, each locked in id order (no deadlock between claimers), so
-- that limited claims of the same kinds take turns, also where a throttle is all there
-- is. job_claim_limited then runs as a statement of its own, whose snapshot sees the jobs
-- and buckets that the claim before it committed.
WITH limits AS (
    SELECT id FROM mdm.aa_job_limit
    WHERE job_kind = ANY(CAST(:kinds AS mdm.job_kind[]))
    ORDER BY id
    FOR UPDATE
), throttles AS (
    SELECT id FROM mdm.aa_job_throttle
    WHERE job_kind = ANY(CAST(:kinds AS mdm.job_kind[])) AND ends_at > now()
    ORDER BY id
    FOR UPDATE
)
SELECT (SELECT count(*) FROM limits) AS limits, (SELECT count(*) FROM throttles) AS throttles;

-- name: job_claim_limited
-- Claims up to :demand jobs of limited kinds, as many as their limits allow now. A job is
-- governed by its tenant's limit of its kind, else by the kind's; its key is the payload
-- value at the limit's key_path ('' without one). Per limit and key, it may take
-- min(tokens, concurrency - running): the tokens are the bucket's, refilled by the rate for
-- the time since it was last drawn (up to the burst; a new bucket starts full), running are
-- the jobs of that limit and key running now. `clock` is read once, after job_limit_lock
-- was granted, so buckets are drawn in the order they are locked. A throttled job is never
-- claimed, so no attempt is spent on it.
-- A throttled destination (sql/throttles.sql: a kind, or a value of a payload field, that
-- refused work) caps its jobs the same way, with a bucket of its own at the rate it allows
-- now (none while it is paused): a job must fit both its limit's allowance and its
-- throttle's, each counted in its own order.
-- The candidates are the :scan most urgent due jobs (`plain`) and, with :fair when more
-- are due and fewer than :pairs tenants own those, the jobs that `walk` finds beyond them:
-- a tenant's backlog held back by its own limit, or a throttled key at the head of the
-- queue, would otherwise hide every job behind it. The walk visits (priority level,
-- tenant) pairs through ix_job_fair, one index probe each, from the most urgent level down
-- the levels, each level's tenants from :start down and then round from the highest (as
-- job_claim_fair's walk; the worker moves :start on, queries.py), :pairs pairs at most;
-- each pair brings its oldest due jobs (`picks`). With :fair the allowances then go round
-- the tenants within a level: a job's `turn` is its place among its tenant's candidates at
-- its level, over the tenant's weight, and jobs are taken by priority, turn and due time;
-- without :fair, by priority and due time.
WITH RECURSIVE clock AS MATERIALIZED (
    SELECT clock_timestamp() AS now
), lim AS MATERIALIZED (
    SELECT id, job_kind, tenant_id, key_path, rate_per_sec, burst, concurrency
    FROM mdm.aa_job_limit
    WHERE job_kind = ANY(CAST(:kinds AS mdm.job_kind[]))
), thr AS MATERIALIZED (
    SELECT t.id, t.job_kind, t.key_path, t.key, t.tokens, t.refilled_at,
           c.now < t.paused_until AS paused,
           CASE WHEN c.now < t.paused_until THEN 0.0
                ELSE LEAST(COALESCE(t.ceiling_per_sec, CAST('Infinity' AS float8)),
                           t.rate_per_sec
                           * power(2.0, CAST(EXTRACT(EPOCH FROM c.now - t.paused_until)
                                             AS float8) / t.step_secs)) END AS rate
    FROM mdm.aa_job_throttle t CROSS JOIN clock c
    WHERE t.job_kind = ANY(CAST(:kinds AS mdm.job_kind[])) AND t.ends_at > c.now
), due AS NOT MATERIALIZED (
    -- Every due job of these kinds that no pause holds, with the limit and throttle that
    -- govern it. Not materialized: each scan below reads it through its own bounds.
    SELECT j.id, j.tenant_id, j.priority, j.available_at, l.id AS limit_id,
           COALESCE(j.payload #>> l.key_path, '') AS key, t.id AS throttle_id
    FROM mdm.aa_job j
    LEFT JOIN LATERAL (
        SELECT lim.id, lim.key_path FROM lim
        WHERE lim.job_kind = j.job_kind AND (lim.tenant_id IS NULL OR lim.tenant_id = j.tenant_id)
        ORDER BY lim.tenant_id NULLS LAST
        LIMIT 1
    ) l ON true
    -- Its destination's throttle, the slowest if two match (the kind's and its key's).
    LEFT JOIN LATERAL (
        SELECT thr.id FROM thr
        WHERE thr.job_kind = j.job_kind
          AND (thr.key_path IS NULL OR j.payload #>> thr.key_path = thr.key)
        ORDER BY thr.rate, thr.id
        LIMIT 1
    ) t ON true
    WHERE j.status = 'pending'
      AND j.available_at <= now()
      AND j.job_kind = ANY(CAST(:kinds AS mdm.job_kind[]))
      AND (CAST(:tenant_ids AS uuid[]) IS NULL OR j.tenant_id = ANY(CAST(:tenant_ids AS uuid[])))
      AND (NOT EXISTS (SELECT FROM mdm.aa_job_pause)
           OR NOT EXISTS (SELECT FROM mdm.aa_job_pause p
                          WHERE (p.tenant_id IS NULL OR p.tenant_id = j.tenant_id)
                            AND (p.job_kind IS NULL OR p.job_kind = j.job_kind)))
), plain AS MATERIALIZED (
    SELECT * FROM due ORDER BY priority, available_at LIMIT :scan
), walk (priority, tenant_id, lap, n) AS (
    -- A start before the most urgent level (no level, no tenant), which the step below
    -- leaves for that level's first tenant. Needed only when few tenants' jobs fill
    -- `plain`: short of :scan, it holds every due job; among many tenants, the turns below
    -- share the claim, and another tenant hidden behind them is one of many.
    SELECT CAST(NULL AS smallint), CAST(NULL AS uuid), 1, 0
    WHERE CAST(:fair AS boolean)
      AND (SELECT count(*) FROM plain) >= :scan
      AND (SELECT count(DISTINCT tenant_id) FROM plain) < :pairs
    UNION ALL
    SELECT x.priority, x.tenant_id, x.lap, w.n + 1
    FROM walk w CROSS JOIN LATERAL (
        -- The level's next tenant down in this lap; of each UNION ALL ... LIMIT 1 a branch
        -- runs only when those before it found none.
        (SELECT d.priority, d.tenant_id, w.lap AS lap FROM due d
         WHERE d.priority = w.priority AND d.tenant_id < w.tenant_id
           AND (w.lap = 0 OR d.tenant_id >= CAST(:start AS uuid))
         ORDER BY d.tenant_id DESC LIMIT 1)
        UNION ALL
        -- Round from the level's highest tenant, once.
        (SELECT d.priority, d.tenant_id, 1 AS lap FROM due d
         WHERE w.lap = 0 AND d.priority = w.priority AND d.tenant_id >= CAST(:start AS uuid)
         ORDER BY d.tenant_id DESC LIMIT 1)
        UNION ALL
        -- The next level, its tenants from :start down as well.
        (SELECT nf.priority, nf.tenant_id, nf.lap
         FROM (SELECT e.priority FROM due e  -- not min(): this stops at the first
               WHERE e.priority > COALESCE(w.priority, -32769)
               ORDER BY e.priority LIMIT 1) nl
         CROSS JOIN LATERAL (
             (SELECT d.priority, d.tenant_id, 0 AS lap FROM due d
              WHERE d.priority = nl.priority AND d.tenant_id < CAST(:start AS uuid)
              ORDER BY d.tenant_id DESC LIMIT 1)
             UNION ALL
             (SELECT d.priority, d.tenant_id, 1 AS lap FROM due d
              WHERE d.priority = nl.priority AND d.tenant_id >= CAST(:start AS uuid)
              ORDER BY d.tenant_id DESC LIMIT 1)
             LIMIT 1
         ) nf)
        LIMIT 1
    ) x
    WHERE w.n < :pairs
), picks AS MATERIALIZED (
    -- Each pair's oldest jobs: all a claim could take when the walk found one or two
    -- pairs, fewer each when it found more, twice its even part of the claim at least.
    SELECT d.*
    FROM (SELECT priority, tenant_id,
                 LEAST(:demand, CEIL(2.0 * :demand / count(*) OVER ())) AS share
          FROM walk WHERE n > 0) w
    CROSS JOIN LATERAL (
        SELECT * FROM due
        WHERE due.priority = w.priority AND due.tenant_id = w.tenant_id
        ORDER BY due.available_at
        LIMIT w.share
    ) d
), weights AS MATERIALIZED (
    SELECT * FROM unnest(CAST(:weight_tenants AS uuid[]), CAST(:weights AS integer[]))
        AS x (tenant_id, weight)
), candidate AS MATERIALIZED (
    SELECT c.*,
           CASE WHEN CAST(:fair AS boolean)
                THEN row_number() OVER (PARTITION BY c.priority, c.tenant_id
                                        ORDER BY c.available_at)
                     / CAST(COALESCE(wt.weight, 1) AS float8)
                ELSE 0 END AS turn
    FROM (SELECT * FROM plain
          UNION ALL
          SELECT * FROM picks p WHERE NOT EXISTS (SELECT FROM plain WHERE plain.id = p.id)) c
    LEFT JOIN weights wt ON wt.tenant_id = c.tenant_id
), running AS MATERIALIZED (
    SELECT l.id AS limit_id, COALESCE(j.payload #>> l.key_path, '') AS key, count(*) AS n
    FROM lim l
    JOIN mdm.aa_job j
      ON j.status = 'running' AND j.job_kind = l.job_kind
     AND (l.tenant_id IS NULL OR j.tenant_id = l.tenant_id)
    WHERE l.concurrency IS NOT NULL
      -- A kind-wide limit does not count the jobs of a tenant that has its own.
      AND (l.tenant_id IS NOT NULL
           OR NOT EXISTS (SELECT FROM lim o
                          WHERE o.job_kind = l.job_kind AND o.tenant_id = j.tenant_id))
    GROUP BY 1, 2
), allowance AS MATERIALIZED (
    SELECT k.limit_id, k.key, l.rate_per_sec, l.burst,
           CASE WHEN l.rate_per_sec IS NULL THEN NULL
                ELSE LEAST(l.burst, COALESCE(
                    b.tokens + l.rate_per_sec
                               * GREATEST(EXTRACT(EPOCH FROM c.now - b.refilled_at), 0),
                    l.burst)) END AS tokens,
           LEAST(CASE WHEN l.rate_per_sec IS NULL THEN :demand
                      ELSE floor(LEAST(l.burst, COALESCE(
                          b.tokens + l.rate_per_sec
                                     * GREATEST(EXTRACT(EPOCH FROM c.now - b.refilled_at), 0),
                          l.burst))) END,
                 CASE WHEN l.concurrency IS NULL THEN :demand
                      ELSE l.concurrency - COALESCE(r.n, 0) END) AS allowed
    FROM (SELECT DISTINCT limit_id, key FROM candidate WHERE limit_id IS NOT NULL) k
    CROSS JOIN clock c
    JOIN lim l ON l.id = k.limit_id
    LEFT JOIN mdm.aa_job_limit_bucket b ON b.limit_id = k.limit_id AND b.key = k.key
    LEFT JOIN running r ON r.limit_id = k.limit_id AND r.key = k.key
), throttle_allowance AS MATERIALIZED (
    -- A throttle's bucket holds about one second's worth (at least one job).
    SELECT id, rate, tokens, CASE WHEN paused THEN 0 ELSE floor(tokens) END AS allowed
    FROM (SELECT t.id, t.rate, t.paused,
                 LEAST(GREATEST(1.0, round(t.rate)),
                       t.tokens + t.rate
                                  * GREATEST(CAST(EXTRACT(EPOCH FROM c.now - t.refilled_at)
                                                  AS float8), 0.0)) AS tokens
          FROM thr t CROSS JOIN clock c
          WHERE t.id IN (SELECT throttle_id FROM candidate)) AS b
), ranked AS MATERIALIZED (
    SELECT c.id, c.limit_id, c.key, c.throttle_id, c.priority, c.available_at,
           c.turn,
           row_number() OVER (PARTITION BY c.limit_id, c.key
                              ORDER BY c.priority, c.turn, c.available_at) AS rank,
           row_number() OVER (PARTITION BY c.throttle_id
                              ORDER BY c.priority, c.turn, c.available_at) AS throttle_rank
    FROM candidate c
), picked AS MATERIALIZED (
    SELECT r.id
    FROM ranked r
    LEFT JOIN allowance a ON a.limit_id = r.limit_id AND a.key = r.key
    LEFT JOIN throttle_allowance ta ON ta.id = r.throttle_id
    WHERE (r.limit_id IS NULL OR r.rank <= a.allowed)
      AND (r.throttle_id IS NULL OR r.throttle_rank <= ta.allowed)
    ORDER BY r.priority, r.turn, r.available_at
    LIMIT :demand
), locked AS MATERIALIZED (
    -- Rechecked under the row lock: a job cancelled or claimed meanwhile is passed by.
    SELECT j.id, c.limit_id, c.key, c.throttle_id
    FROM mdm.aa_job j JOIN candidate c ON c.id = j.id
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) AND j.status = 'pending'
    FOR UPDATE OF j SKIP LOCKED
), drawn AS (
    INSERT INTO mdm.aa_job_limit_bucket (limit_id, key, tokens, refilled_at)
    SELECT a.limit_id, a.key,
           a.tokens - (SELECT count(*) FROM locked k
                       WHERE k.limit_id = a.limit_id AND k.key = a.key),
           c.now
    FROM allowance a CROSS JOIN clock c
    WHERE a.rate_per_sec IS NOT NULL
    ON CONFLICT (limit_id, key) DO UPDATE
    SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at
), throttle_drawn AS (
    UPDATE mdm.aa_job_throttle t
    SET tokens = ta.tokens - (SELECT count(*) FROM locked k WHERE k.throttle_id = t.id),
        refilled_at = c.now
    FROM throttle_allowance ta CROSS JOIN clock c
    WHERE t.id = ta.id AND ta.rate > 0
)
-- claimed_at is the moment the buckets were drawn (not the transaction's start, which
-- came before the wait for job_limit_lock): claims per second read from it keep to the rate.
UPDATE mdm.aa_job j
SET status = 'running', claimed_by = :worker, claimed_at = (SELECT now FROM clock),
    attempts = j.attempts + 1
WHERE j.id = ANY(ARRAY(SELECT id FROM locked))
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
