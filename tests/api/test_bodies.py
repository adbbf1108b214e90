"""Bodies that are not a JSON object, on every endpoint that takes one: 400 naming `body` and
what the API wants (a JSON object, as application/json, in UTF-8), and nothing written."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.api.conftest import error

BODY_ENDPOINTS = ["/v1/functions/jobs", "/v1/functions/jobs/cancel", "/v1/functions/cron",
                  "/v1/functions/pauses", "/v1/functions/pauses/resume",
                  "/v1/functions/limits", "/v1/functions/limits/remove",
                  "/v1/functions/outbox/replay"]
JOB = b'{"kind": "reindex"}'


def nothing_written(engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(text("SELECT (SELECT count(*) FROM mdm.aa_job) "
                                 "+ (SELECT count(*) FROM mdm.aa_job_pause)")).scalar_one() == 0


@pytest.mark.parametrize("path", BODY_ENDPOINTS)
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          None])
def test_a_json_object_of_another_content_type_is_told_the_content_type(
        api, engine, path, content_type):
    headers = {"content-type": content_type} if content_type else {}
    problem = error(api.post(path, content=JOB, headers=headers), 400)
    assert problem["field"] == "body", problem
    assert "sent as Content-Type: application/json" in problem["message"], problem
    assert f"got Content-Type {content_type or '(none)'}" in problem["message"], problem
    assert nothing_written(engine)


@pytest.mark.parametrize("path", BODY_ENDPOINTS)
@pytest.mark.parametrize("body", [b"[]", b"42", b'"reindex"', b"null"])
def test_json_that_is_not_an_object_is_400_saying_so(api, engine, path, body):
    problem = error(api.post(path, content=body,
                             headers={"content-type": "application/json"}), 400)
    assert problem["field"] == "body", problem
    assert problem["message"] == "body: must be a JSON object", problem
    assert nothing_written(engine)


def test_a_body_not_in_utf8_is_400_naming_the_body(api, engine):
    latin1 = '{"kind": "réindex"}'.encode("latin-1")
    for body in (b"\xff\xfe{", latin1):
        problem = error(api.post("/v1/functions/jobs", content=body,
                                 headers={"content-type": "application/json"}), 400)
        assert problem["field"] == "body" and "UTF-8" in problem["message"], problem
    assert nothing_written(engine)
