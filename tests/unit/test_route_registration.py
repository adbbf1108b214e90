"""A route that could not route is refused when it is registered, naming the argument."""

from __future__ import annotations

import pytest

from postrelay.core.errors import ValidationError
from postrelay.relay import Event, JobRequest, RouteRegistry


def reindex(event: Event) -> JobRequest:
    return JobRequest("reindex", {})


@pytest.mark.parametrize(("args", "kwargs", "field"), [
    # Not text: matching it raised for every event, of every type, until each was dead.
    ((123, reindex), {}, "event_type"),
    (("order.\x00", reindex), {}, "event_type"),
    (("order.placed", "reindex"), {}, "fn"),  # failed every matching event at routing
    (("order.placed", reindex), {"name": 7}, "name"),
    # Part of every job's idempotency key: each matching event failed, until dead.
    (("order.placed", reindex), {"name": "a\x00b"}, "name"),
    (("order.placed", reindex), {"name": "r" * 600}, "name"),
    (("order.placed", reindex), {"name": "r" * 256}, "name"),
])
def test_a_route_that_could_not_route_is_refused(args, kwargs, field) -> None:
    routes = RouteRegistry()
    with pytest.raises(ValidationError) as caught:
        routes.add(*args, **kwargs)
    assert caught.value.field == field
    assert len(routes) == 0


def test_route_without_its_event_type_is_refused() -> None:
    """`@route` without parentheses registered nothing, said nothing, and left the module
    with the decorator in place of the function: its events were handled with no job."""
    routes = RouteRegistry()
    with pytest.raises(ValidationError, match='@route needs the event type'):
        @routes.route  # type: ignore[arg-type]
        def placed(event: Event) -> JobRequest:
            return JobRequest("reindex", {})


def test_a_route_at_the_limits_is_registered() -> None:
    routes = RouteRegistry()
    routes.add("o" * 255, reindex, name="r" * 255)
    routes.add("*", lambda event: None, name="anything")
    assert len(routes) == 2
