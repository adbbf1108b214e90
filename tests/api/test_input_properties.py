"""The HTTP jobs API under the same property as the library (tests/integration/
test_input_properties.py): arbitrary JSON, control characters, NULs, huge and deep payloads
get 201 or a 4xx with the error envelope, never a 500."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from tests.integration.test_input_properties import KEYS, PAYLOADS, PRIORITIES, PROPERTY


@PROPERTY
@given(payload=PAYLOADS, key=KEYS, delay=st.one_of(st.none(), st.floats(-10, 1e12)),
       priority=PRIORITIES)
def test_the_jobs_api_answers_201_or_4xx(acme_client, payload, key, delay, priority):
    body: dict[str, Any] = {"kind": "reindex", "payload": payload, "priority": priority}
    if key is not None:
        body["idempotencyKey"] = key
    if delay is not None and math.isfinite(delay):
        body["delaySecs"] = delay
    try:
        content = json.dumps(body)
    except RecursionError:  # too deep for the client's encoder; see the test below
        assume(False)
    response = acme_client.post("/v1/functions/jobs", content=content,
                                headers={"content-type": "application/json"})
    assert response.status_code in (201, 400, 413), response.text
    if response.status_code != 201:
        error = response.json()["error"]
        assert response.json()["data"] is None and error["code"] and error["message"]


def test_a_payload_as_deep_as_the_api_parser_allows_is_still_a_400(acme_client):
    # Depths where Python's own recursion gives out, nowhere near the Hypothesis budget.
    for levels in (990, 1000, 1100, 20_000):
        body = '{"kind": "reindex", "payload": ' + '{"a": ' * levels + "1" + "}" * levels + "}"
        response = acme_client.post("/v1/functions/jobs", content=body,
                                    headers={"content-type": "application/json"})
        assert response.status_code == 400, (levels, response.text)

