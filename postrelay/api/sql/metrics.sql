-- The scrape of /metrics (postrelay/api/metrics/scrape.py).

-- name: metrics_lock_timeout
-- Each collector's reads run in a transaction of their own: a table locked by a migration or
-- a VACUUM FULL fails that collector after :timeout instead of holding the whole scrape
-- past Prometheus's scrape timeout. Local to the transaction, so a pooler's next client
-- never inherits it.
SELECT set_config('lock_timeout', :timeout, true);
