"""RouteRegistry.matching remembers each event type's routes, and forgets on a new route."""

from postrelay.relay.routing import JobRequest, RouteRegistry


def reindex(event):
    return JobRequest("reindex", {})


def test_a_route_added_later_is_matched_by_event_types_seen_before():
    routes = RouteRegistry()
    routes.add("order.*", reindex, name="orders")
    assert [r.name for r in routes.matching("order.placed")] == ["orders"]
    routes.add("order.placed", reindex, name="placed")
    assert [r.name for r in routes.matching("order.placed")] == ["orders", "placed"]
    assert routes.matching("user.created") == []
