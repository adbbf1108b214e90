"""The API's answers to oversized and deeply nested input: 413 with the error envelope for
a body or a payload over POSTRELAY_MAX_PAYLOAD_BYTES (the body refused before it is read),
400 for a payload nested past the limit, never a 500."""

from __future__ import annotations

from sqlalchemy import text

from postrelay.core.limits import DEFAULT_MAX_PAYLOAD_BYTES
from tests.api.conftest import error

JOBS = "/v1/functions/jobs"


def no_jobs(engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM mdm.aa_job")).scalar_one() == 0


def test_a_payload_over_the_limit_is_413(api, engine, tenant):
    body = {"kind": "reindex", "tenantId": str(tenant),
            "payload": {"blob": "x" * (DEFAULT_MAX_PAYLOAD_BYTES + 1)}}
    problem = error(api.post(JOBS, json=body), 413)
    assert problem["code"] == "payload_too_large" and problem["field"] == "payload"
    assert "over the limit of 262144" in problem["message"]
    assert no_jobs(engine)


def test_a_body_over_the_limit_is_refused_before_it_is_read(api, engine, tenant):
    huge = b'{"kind": "reindex", "payload": {"blob": "' + b"x" * (2 * 1024 * 1024) + b'"}}'
    problem = error(api.post(JOBS, content=huge, headers={"content-type": "application/json"}),
                    413)
    assert problem["code"] == "payload_too_large"
    assert "request body" in problem["message"]

    def chunks():  # no Content-Length: counted as it arrives
        yield b'{"kind": "reindex", "payload": {"blob": "'
        for _ in range(64):
            yield b"y" * 32768
        yield b'"}}'

    problem = error(api.post(JOBS, content=chunks(), headers={"content-type": "application/json"}),
                    413)
    assert problem["code"] == "payload_too_large"
    assert no_jobs(engine)


def test_a_deep_payload_is_400_naming_the_rule(api, engine, tenant):
    for levels in (65, 300, 900, 990, 5000):
        body = ('{"kind": "reindex", "payload": ' + '{"a": ' * levels + "1" + "}" * levels
                + "}")
        response = api.post(JOBS, content=body, headers={"content-type": "application/json"})
        problem = error(response, 400)
        # Past the parser's own limit, the body as a whole is too deep to read.
        assert problem["field"] in ("payload", "body"), problem
        assert "more than 64 levels deep" in problem["message"], problem
    assert no_jobs(engine)


def test_a_nul_in_a_payload_is_400(api, engine, tenant):
    problem = error(api.post(JOBS, json={"kind": "reindex", "payload": {"a\u0000": 1}}), 400)
    assert "NUL" in problem["message"]
    assert no_jobs(engine)
