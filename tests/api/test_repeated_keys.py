"""A JSON body whose object gives a key twice, on every endpoint that takes a body: 400 naming
the key and where it is, and nothing written. json kept the last of the two, so
`{"kind": "a", "kind": "b"}` was enqueued as `b` while a reader that keeps the first (a
proxy, a log, an audit) saw `a`."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from fastapi.routing import APIRoute

import postrelay.api.routers
from postrelay.api.bodies import JsonBodyRoute, RepeatedKeyError, parse_body
from tests.api.conftest import data, error
from tests.api.test_bodies import BODY_ENDPOINTS, nothing_written

JSON = {"content-type": "application/json"}


@pytest.mark.parametrize("path", BODY_ENDPOINTS)
def test_a_key_given_twice_is_400_naming_it_on_every_body_endpoint(api, engine, path):
    body = b'{"kind": "reindex", "kind": "reindex"}'
    problem = error(api.post(path, content=body, headers=JSON), 400)
    assert problem["code"] == "invalid_request", problem
    assert problem["field"] == "kind", problem
    assert problem["message"] == ("kind: given more than once in the same object; "
                                  "give each key once"), problem
    assert nothing_written(engine)


@pytest.mark.parametrize(("body", "field"), [
    (b'{"kind": "reindex", "payload": {"to": "a@example.com", "to": "b@example.com"}}',
     "payload.to"),
    (b'{"kind": "reindex", "payload": {"items": [{"sku": 1}, {"sku": 1, "sku": 2}]}}',
     "payload.items[1].sku"),
    (b'{"kind": "reindex", "payload": {"a b": 1, "a b": 2}}', 'payload["a b"]'),
    # Named in ASCII: half a surrogate pair could not be answered in UTF-8.
    (b'{"kind": "reindex", "payload": {"\\ud800": 1, "\\ud800": 2}}', 'payload["\\ud800"]'),
    # The same key however it is escaped: readers compare keys after decoding.
    (b'{"kind": "reindex", "k\\u0069nd": "cleanup_jobs"}', "kind"),
    # The first, when several objects repeat a key.
    (b'{"kind": "reindex", "payload": {"a": {"x": 1, "x": 2}, "b": {"y": 1, "y": 2}}}',
     "payload.a.x"),
])
def test_the_place_of_a_repeated_key_is_named(api, engine, body, field):
    problem = error(api.post("/v1/functions/jobs", content=body, headers=JSON), 400)
    assert problem["field"] == field, problem
    assert problem["message"].startswith(f"{field}: given more than once"), problem
    assert nothing_written(engine)


def test_keys_that_differ_only_in_case_or_place_are_taken(api, tenant):
    body = (b'{"kind": "reindex", "payload": {"to": 1, "To": 2, "a": {"to": 3},'
            b' "list": [{"to": 4}, {"to": 5}]}}')
    job = data(api.post("/v1/functions/jobs", content=body, headers=JSON), 201)
    assert job["payload"] == {"to": 1, "To": 2, "a": {"to": 3}, "list": [{"to": 4}, {"to": 5}]}


def test_the_locating_parse_names_a_top_level_array_and_shortens_a_long_key():
    with pytest.raises(RepeatedKeyError) as found:
        parse_body(b'[{"a": 1}, {"a": 1, "a": 2}]')
    assert found.value.field == "body[1].a"
    long = "k " * 200
    with pytest.raises(RepeatedKeyError) as found:
        parse_body(f'{{"{long}": 1, "{long}": 2}}'.encode())
    assert found.value.key == long
    assert len(str(found.value)) < 200 and '..."]: given more' in str(found.value)


def test_every_route_with_a_json_body_refuses_repeated_keys():
    """A router made without JsonBodyRoute would read its bodies as json does."""
    with_bodies = []
    for module in pkgutil.iter_modules(postrelay.api.routers.__path__):
        routes = importlib.import_module(f"postrelay.api.routers.{module.name}").router.routes
        for route in routes:
            if isinstance(route, APIRoute) and route.body_field is not None:
                assert isinstance(route, JsonBodyRoute), (module.name, route.path)
                with_bodies.append(route.path)
    assert len(with_bodies) == len(BODY_ENDPOINTS), with_bodies
