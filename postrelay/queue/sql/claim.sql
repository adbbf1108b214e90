-- The claims: plain, shared out across tenants, and within rate and concurrency limits;
-- the limited kinds, and when the next job falls due. Loaded with job.sql into JOB_SQL
-- (queue/queries.py).

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
-- the jobs of that limit and key running now. The :scan oldest due jobs are the candidates:
-- a key throttled at the head of the queue holds back the others beyond them. `clock` is
-- read once, after job_limit_lock was granted, so buckets are drawn in the order they are
-- locked. A throttled job is never claimed, so no attempt is spent on it.
-- A throttled destination (sql/throttles.sql: a kind, or a value of a payload field, that
-- refused work) caps its jobs the same way, with a bucket of its own at the rate it allows
-- now (none while it is paused): a job must fit both its limit's allowance and its
-- throttle's, each counted in its own order of priority and due time.
WITH clock AS MATERIALIZED (
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
), candidate AS MATERIALIZED (
    SELECT j.id, j.priority, j.available_at, l.id AS limit_id,
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
    ORDER BY j.priority, j.available_at
    LIMIT :scan
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
           row_number() OVER (PARTITION BY c.limit_id, c.key
                              ORDER BY c.priority, c.available_at) AS rank,
           row_number() OVER (PARTITION BY c.throttle_id
                              ORDER BY c.priority, c.available_at) AS throttle_rank
    FROM candidate c
), picked AS MATERIALIZED (
    SELECT r.id
    FROM ranked r
    LEFT JOIN allowance a ON a.limit_id = r.limit_id AND a.key = r.key
    LEFT JOIN throttle_allowance ta ON ta.id = r.throttle_id
    WHERE (r.limit_id IS NULL OR r.rank <= a.allowed)
      AND (r.throttle_id IS NULL OR r.throttle_rank <= ta.allowed)
    ORDER BY r.priority, r.available_at
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
