"""Query parameters: one the endpoint does not take, or one given twice, is a 400 naming it,
never dropped while the rest of the request goes ahead."""

from __future__ import annotations

import uuid

import pytest

from tests.api.conftest import data, error
from tests.factories import insert_job


@pytest.mark.parametrize(("method", "path", "field"), [
    ("GET", "/v1/functions/jobs?state=dlq", "state"),
    ("GET", "/v1/functions/jobs?status=dlq&tenantId=" + str(uuid.UUID(int=1)), "tenantId"),
    ("GET", "/v1/functions/jobs/dlq?limt=5", "limt"),
    ("POST", "/v1/functions/jobs/dlq/requeue?kind=reindex", "kind"),
    ("GET", "/v1/functions/cron?tenantId=" + str(uuid.UUID(int=1)), "tenantId"),
    ("POST", "/v1/functions/pauses?all=true", "all"),
    ("POST", "/v1/functions/jobs?tenantId=" + str(uuid.UUID(int=1)), "tenantId"),
])
def test_a_parameter_the_endpoint_does_not_take_is_400(api, tenant, method, path, field):
    """`?state=dlq` was ignored and every job came back; a requeue with `?kind=` requeued
    every dead job of every kind; an enqueue with `?tenantId=` went to the system tenant."""
    err = error(api.request(method, path, json={}), 400)
    assert err["field"] == field
    assert err["message"].startswith(f"{field}: not a query parameter of this endpoint")


def test_a_requeue_with_an_unknown_filter_requeues_nothing(api, engine, tenant):
    with engine.begin() as conn:
        insert_job(conn, tenant_id=tenant, kind="email_send", status="dlq")
    error(api.post("/v1/functions/jobs/dlq/requeue?kind=reindex"), 400)
    assert data(api.get("/v1/functions/jobs/dlq"))[0]["status"] == "dlq"


@pytest.mark.parametrize("query", ["status=done&status=dlq", "limit=1&limit=2"])
def test_a_parameter_given_twice_is_400(api, tenant, query):
    """`?status=done&status=dlq` listed the dlq jobs alone, not both."""
    err = error(api.get(f"/v1/functions/jobs?{query}"), 400)
    name = query.split("=")[0]
    assert err["field"] == name and "given more than once" in err["message"]


def test_the_parameters_an_endpoint_takes_still_work(api, engine, tenant, anonymous):
    with engine.begin() as conn:
        insert_job(conn, tenant_id=tenant, status="dlq")
    assert len(data(api.get("/v1/functions/jobs?status=dlq&limit=5"))) == 1
    assert data(api.post("/v1/functions/jobs/dlq/requeue?limit=10")) == {"requeued": 1}
    # Without a key the answer is a 401 whatever the query says.
    error(anonymous.get("/v1/functions/jobs?state=dlq"), 401)


def test_the_openapi_document_says_every_admin_endpoint_can_answer_400(anonymous):
    paths = anonymous.get("/openapi.json").json()["paths"]
    for path in ("/v1/functions/cron", "/v1/functions/pauses", "/v1/functions/limits",
                 "/v1/functions/outbox/status", "/v1/functions/webhooks"):
        assert "400" in paths[path]["get"]["responses"], path


@pytest.mark.parametrize("path", ["/v1/functions/jobs", "/v1/functions/jobs/dlq"])
@pytest.mark.parametrize("limit", ["1.0", "1_0", "+5", " 5", "", "٥"])
def test_a_limit_not_in_plain_digits_is_400(api, tenant, path, limit):
    """"1_0" listed 10 jobs and "1.0" one: pydantic's reading of a string as a number."""
    err = error(api.get(path, params={"limit": limit}), 400)
    assert err["field"] == "limit"
    assert err["message"].startswith("limit: must be a whole number in plain digits"), err


def test_a_requeue_limit_not_in_plain_digits_requeues_nothing(api, engine, tenant):
    with engine.begin() as conn:
        insert_job(conn, tenant_id=tenant, status="dlq")
    err = error(api.post("/v1/functions/jobs/dlq/requeue", params={"limit": "1_0"}), 400)
    assert err["field"] == "limit"
    assert data(api.get("/v1/functions/jobs/dlq"))[0]["status"] == "dlq"
    # A number out of range is told the range, as before.
    err = error(api.get("/v1/functions/jobs", params={"limit": "-1"}), 400)
    assert err["message"] == "limit: Input should be greater than or equal to 1"
    assert len(data(api.get("/v1/functions/jobs/dlq", params={"limit": "050"}))) == 1
