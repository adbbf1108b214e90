"""/metrics as a strict parser reads it, fed the odd names and rows that real installations
hold: tenant names with quotes, backslashes, unicode, names differing only in case, very
long ones; kinds added to the enum by hand; outbox rows written by other languages' code."""

from __future__ import annotations

import uuid
from collections import Counter

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from postrelay.core.db import sqlalchemy_url
from postrelay.core.migrate import upgrade
from postrelay.queue import ensure_tenant
from tests.api.conftest import SERVICE_KEY, data, tenant_key
from tests.api.server import serve_database
from tests.factories import insert_job
from tests.feedback.conftest import insert_log
from tests.migrations import throwaway_database

TENANT_NAMES = ['we"ird', "back\\slash", 'both\\"mixed', "ACME", "acme", "Åçmé ☃ 客户",
                "x" * 255]
ODD_KINDS = ['we"ird\\kind', "line\nbreak"]


def _scrape(api: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample once, parsed strictly: a family or a series given twice fails."""
    response = api.get("/metrics")
    assert response.status_code == 200, response.text
    types = Counter(line.split()[2] for line in response.text.splitlines()
                    if line.startswith("# TYPE "))
    assert [name for name, n in types.items() if n > 1] == []
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            series = (sample.name, tuple(sorted(sample.labels.items())))
            assert series not in samples, series
            samples[series] = sample.value
    return samples


def test_odd_tenant_and_kind_names_each_make_one_series(server_url):
    # A database of its own: the kinds added stay in the enum for good, and would show in
    # every later test's dashboard filters.
    with throwaway_database(server_url) as url:
        upgrade(url)
        engine = create_engine(sqlalchemy_url(url), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:  # as a DBA would: `kinds add` allows [a-z][a-z0-9_]*
            for kind in ODD_KINDS:
                quoted = kind.replace("'", "''")
                conn.execute(text(f"ALTER TYPE mdm.job_kind ADD VALUE '{quoted}'"))
        with engine.begin() as conn:
            tenants = {name: ensure_tenant(conn, name) for name in TENANT_NAMES}
            for tenant_id in tenants.values():
                insert_log(conn, tenant_id=tenant_id)
            for kind in ODD_KINDS:
                insert_job(conn, tenant_id=tenants["ACME"], kind=kind)
        engine.dispose()
        with serve_database(url, SERVICE_KEY) as base, \
                httpx.Client(base_url=base, headers={"apikey": SERVICE_KEY}) as api:
            samples = _scrape(api)
    for kind in ODD_KINDS:
        assert samples[("postrelay_jobs", (("kind", kind), ("status", "pending")))] == 1
    for name, tenant_id in tenants.items():
        labels = (("tenant", name), ("tenant_id", str(tenant_id)), ("window", "24h"))
        assert samples[("postrelay_email_answered", labels)] == 1
        assert samples[("postrelay_email_bounce_rate", labels)] == 0


def test_an_outbox_event_written_at_infinity_leaves_the_scrape_whole(api, api_url, engine,
                                                                      tenant):
    """`now() - '-infinity'` is an error in PostgreSQL: the outbox figures failed, and the
    scrape said postrelay_database_up 0 without a single queue figure; the tenant's own
    outbox status was a 400. Such an event counts in the backlog, without an age, as a job
    due at -infinity does."""
    with engine.begin() as conn:
        insert_job(conn, tenant_id=tenant)
        for created_at in ("-infinity", "infinity", "now"):
            conn.execute(text(
                "INSERT INTO mdm.aa_outbox_event (tenant_id, aggregate_type, aggregate_id, "
                "event_type, payload, created_at) VALUES (:tenant, 'order', :id, "
                "'order.placed', '{}', CAST(:at AS timestamptz) - interval '60 seconds')"),
                {"tenant": tenant, "id": str(uuid.uuid4()), "at": created_at})
    samples = _scrape(api)
    assert samples[("postrelay_database_up", ())] == 1
    assert samples[("postrelay_jobs", (("kind", "reindex"), ("status", "pending")))] == 1
    assert samples[("postrelay_outbox_backlog", ())] == 3
    assert 60 <= samples[("postrelay_outbox_lag_seconds", ())] < 120
    key = tenant_key(engine, "acme-app", tenant)
    status = data(httpx.get(f"{api_url}/v1/functions/outbox/status",
                            headers={"apikey": key}, timeout=30))
    assert status["backlog"] == 3 and 60 <= status["lag_secs"] < 120, status
