"""/healthz, /readyz (database reachable, migrations at head), /metrics, and the OpenAPI."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import text

from postrelay.core.migrate import head_revision
from tests.api.conftest import SERVICE_KEY, data, error
from tests.api.server import serve_database
from tests.factories import insert_job
from tests.migrations import pretend_migrated_by_a_newer_postrelay, throwaway_database


def test_healthz_and_readyz_need_no_key(anonymous):
    assert data(anonymous.get("/healthz")) == {"status": "ok"}
    ready = data(anonymous.get("/readyz"))
    assert ready == {"status": "ready", "revision": head_revision(), "head": head_revision()}


def test_readyz_is_503_on_a_database_behind_head(server_url):
    with throwaway_database(server_url) as url, serve_database(url, SERVICE_KEY) as base:
        err = error(httpx.get(f"{base}/readyz"), 503)
        assert err["code"] == "not_ready"
        assert data(httpx.get(f"{base}/healthz")) == {"status": "ok"}
        from postrelay.core.migrate import upgrade

        upgrade(url, "0002")
        err = error(httpx.get(f"{base}/readyz"), 503)
        assert "at migration 0002" in err["message"] and "postrelay migrate" in err["message"]
        upgrade(url)  # what the message says to do: ready from the next probe on
        assert data(httpx.get(f"{base}/readyz"))["revision"] == head_revision()


def test_readyz_is_ready_on_a_database_a_newer_postrelay_migrated(server_url):
    """A release rolled back meets a schema ahead of it. The worker, the relay and inbound
    run on (postrelay.migrate.schema_ahead); /readyz said 503 "run `postrelay migrate`",
    which refuses such a database, so every API replica left its load balancer at once."""
    from postrelay.core.migrate import upgrade

    with throwaway_database(server_url) as url, serve_database(url, SERVICE_KEY) as base:
        upgrade(url)
        pretend_migrated_by_a_newer_postrelay(url)
        ready = data(httpx.get(f"{base}/readyz"))
        assert ready == {"status": "ready", "revision": "0999", "head": head_revision()}


def test_readyz_is_503_when_the_database_is_unreachable(caplog):
    # Port 9 on loopback (discard): nothing listens there, the connection is refused.
    with serve_database("postgresql://nobody@127.0.0.1:9/none", SERVICE_KEY) as base:
        err = error(httpx.get(f"{base}/readyz", timeout=30), 503)
        assert err["code"] == "not_ready" and "database not ready" in err["message"]
    # The driver's words named the database's address to anyone who asked, without a key;
    # they go to the log.
    assert "127.0.0.1" not in err["message"] and "port 9" not in err["message"]
    logged = [r for r in caplog.records if getattr(r, "event", None) == "postrelay.api.not_ready"]
    assert logged and "port 9" in logged[0].fields["reason"], logged


def test_metrics_in_prometheus_format(api, engine, tenant):
    now = datetime.now(UTC)
    with engine.begin() as conn:
        insert_job(conn, tenant_id=tenant, available_at=now - timedelta(seconds=120))
        insert_job(conn, tenant_id=tenant, available_at=now + timedelta(hours=1))
        insert_job(conn, tenant_id=tenant, kind="email_send", status="dlq")
        insert_job(conn, tenant_id=tenant, kind="email_send", status="done")
    response = api.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    assert samples['postrelay_jobs{kind="reindex",status="pending"}'] == 2
    assert samples['postrelay_jobs{kind="reindex",status="dlq"}'] == 0
    assert samples['postrelay_jobs{kind="email_send",status="dlq"}'] == 1
    assert samples['postrelay_jobs{kind="email_send",status="done"}'] == 1
    assert samples["postrelay_dlq_jobs"] == 1
    assert samples["postrelay_jobs_due_pending"] == 1
    assert 120 <= samples["postrelay_oldest_due_pending_age_seconds"] < 180
    assert samples["postrelay_database_up"] == 1
    assert "# TYPE postrelay_jobs gauge" in response.text


def test_metrics_of_an_empty_queue(api, engine, clean_db):
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE mdm.aa_job CASCADE"))
    text_ = api.get("/metrics").text
    assert "postrelay_dlq_jobs 0.0" in text_
    assert "postrelay_oldest_due_pending_age_seconds 0.0" in text_


def test_openapi_documents_every_path_with_envelopes_and_no_422(anonymous):
    schema = anonymous.get("/openapi.json").json()
    ops = {(m.upper(), p) for p, item in schema["paths"].items() for m in item}
    assert ops == {
        ("POST", "/v1/functions/jobs"), ("GET", "/v1/functions/jobs"),
        ("GET", "/v1/functions/jobs/{id}"), ("GET", "/v1/functions/jobs/dlq"),
        ("POST", "/v1/functions/jobs/{id}/retry"), ("POST", "/v1/functions/jobs/dlq/requeue"),
        ("DELETE", "/v1/functions/jobs/{id}"), ("POST", "/v1/functions/cron"),
        ("GET", "/v1/functions/cron"), ("DELETE", "/v1/functions/cron/{name}"),
        ("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics"),
        ("GET", "/v1/functions/outbox/status"), ("GET", "/v1/functions/outbox/events/{id}"),
        ("POST", "/v1/functions/outbox/replay"),
        ("POST", "/v1/functions/jobs/{id}/cancel"), ("POST", "/v1/functions/jobs/cancel"),
        ("GET", "/v1/functions/pauses"), ("POST", "/v1/functions/pauses"),
        ("POST", "/v1/functions/pauses/resume"), ("GET", "/v1/functions/limits"),
        ("POST", "/v1/functions/limits"), ("POST", "/v1/functions/limits/remove"),
        ("GET", "/v1/functions/webhooks"), ("POST", "/v1/functions/webhooks"),
        ("GET", "/v1/functions/webhooks/{id}"), ("DELETE", "/v1/functions/webhooks/{id}"),
        ("POST", "/v1/functions/webhooks/{id}/disable"),
        ("POST", "/v1/functions/webhooks/{id}/enable"),
        ("GET", "/v1/functions/webhooks/{id}/attempts"),
    }
    for path, item in schema["paths"].items():
        for operation in item.values():
            assert "422" not in operation["responses"], path
    enqueue = schema["paths"]["/v1/functions/jobs"]["post"]
    body_ref = enqueue["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = schema["components"]["schemas"][body_ref.rsplit("/", 1)[1]]
    assert set(body["properties"]) == {"kind", "payload", "delaySecs", "maxAttempts",
                                       "priority", "idempotencyKey", "tenantId"}
    limit = next(p for p in schema["paths"]["/v1/functions/jobs"]["get"]["parameters"]
                 if p["name"] == "limit")
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, 500)
    assert set(schema["components"]["securitySchemes"]) == {"apikey", "bearer"}


def test_every_exported_metric_is_documented(engine, clean_db):
    """docs/operations.md names each metric the API and a worker export: the API's queue
    and outbox gauges were described only loosely, the outbox's not at all."""
    from pathlib import Path

    from postrelay.api.metrics import metrics_registry
    from postrelay.queue.metrics import WorkerMetrics

    operations = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    families = [*metrics_registry(engine, max_tenants=10).collect(),
                *WorkerMetrics().registry.collect()]
    names = {family.name + ("_total" if family.type == "counter" else "")
             for family in families}
    assert len(names) > 15
    assert sorted(name for name in names if f"`{name}`" not in operations) == []
