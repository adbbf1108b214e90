"""Bodies that are not a JSON object, on every endpoint that takes one: 400 naming `body` and
what the API wants (a JSON object, as application/json, in UTF-8), and nothing written; a
compressed body is 415 naming its Content-Encoding."""

from __future__ import annotations

import gzip

import pytest
from sqlalchemy import text

from tests.api.conftest import error

BODY_ENDPOINTS = ["/v1/functions/jobs", "/v1/functions/jobs/cancel", "/v1/functions/cron",
                  "/v1/functions/pauses", "/v1/functions/pauses/resume",
                  "/v1/functions/limits", "/v1/functions/limits/remove",
                  "/v1/functions/outbox/replay", "/v1/functions/webhooks"]
JOB = b'{"kind": "reindex"}'


def nothing_written(engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(text("SELECT (SELECT count(*) FROM mdm.aa_job) "
                                 "+ (SELECT count(*) FROM mdm.aa_job_pause) "
                                 "+ (SELECT count(*) FROM mdm.aa_webhook_endpoint)")
                            ).scalar_one() == 0


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


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "identity, gzip"])
def test_a_compressed_body_is_415_naming_the_content_encoding(api, engine, coding):
    """A gzip body sent as application/json was refused as "must be a JSON object in UTF-8,
    sent as Content-Type: application/json", which is what the client had sent."""
    compressed = gzip.compress(JOB)
    response = api.post("/v1/functions/jobs", content=compressed,
                        headers={"content-type": "application/json",
                                 "content-encoding": coding})
    problem = error(response, 415)
    assert problem["code"] == "unsupported_media_type" and problem["field"] == "Content-Encoding"
    assert problem["message"].startswith("Content-Encoding: ")
    assert "send the body uncompressed" in problem["message"]
    assert response.headers["accept-encoding"] == "identity"
    assert nothing_written(engine)


def test_an_identity_content_encoding_is_no_encoding(api, engine, tenant):
    response = api.post("/v1/functions/jobs", content=JOB,
                        headers={"content-type": "application/json",
                                 "content-encoding": "identity"})
    assert response.status_code == 201, response.text
    # Without a body there is nothing to decode, whatever the header says.
    response = api.get("/v1/functions/jobs", headers={"content-encoding": "gzip"})
    assert response.status_code == 200, response.text


def test_a_compressed_body_sent_in_chunks_is_415(api, engine):
    def chunks():  # no Content-Length: Transfer-Encoding chunked
        yield gzip.compress(JOB)

    response = api.post("/v1/functions/jobs", content=chunks(),
                        headers={"content-type": "application/json",
                                 "content-encoding": "gzip"})
    assert error(response, 415)["field"] == "Content-Encoding"
    assert nothing_written(engine)
