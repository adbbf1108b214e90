"""A tiny application for relay processes in tests: one route per order event."""

from postrelay.relay import Event, JobRequest, route


@route("order.placed", name="reindex-order")
def reindex_order(event: Event) -> JobRequest:
    return JobRequest("reindex", {"order": event.aggregate_id})
