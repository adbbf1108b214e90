"""Property-based fuzz of the served API from the OpenAPI document it serves (schemathesis):
no 500s, and every answer matches the schema (status codes, content types, bodies, headers).
Valid inputs (positive) and invalid ones (negative: those must be refused with a 4xx).

Bounded to a few examples per operation and mode, so it runs in well under a minute.
"""

from __future__ import annotations

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from tests.api.conftest import SERVICE_KEY

MAX_EXAMPLES = 20
# "Schema-valid input must be accepted" cannot hold here: a job kind must exist in the
# database's enum (extensible by migration, so not an enum in the schema), a schedule must
# parse as cron, a tenant must exist. Those answer 400 naming the field, which the other
# checks still hold to the documented envelope. Every other default check runs.
EXCLUDED = [positive_data_acceptance]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                         ids=lambda m: m.value)
def test_fuzz_the_served_api(api_url, tenant, mode):
    # Loaded and driven by hand: schemathesis' pytest plugin (from_fixture) does not run on
    # this pytest version, and the schema exists only once the server runs.
    schema = schemathesis.openapi.from_url(f"{api_url}/openapi.json")
    schema.config.update(base_url=api_url, headers={"apikey": SERVICE_KEY})
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 31  # the cancel, pause, limit and webhook routes included
    failures = []
    with requests.Session() as session:
        for operation in operations:
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            def check(case: schemathesis.Case) -> None:
                case.call_and_validate(session=session, excluded_checks=EXCLUDED)

            try:
                check()
            except Unsatisfiable:
                # Negative mode on an operation without inputs (/healthz): nothing to break.
                assert mode is GenerationMode.NEGATIVE, operation.label
            # Hypothesis raises an exception group for several distinct failures.
            except (Exception, BaseExceptionGroup) as exc:  # report every operation's failure
                failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)
