"""The transactional outbox: `emit` in the caller's transaction; the relay turns events into
jobs through routes. Uses only the queue's public names."""

from postrelay.relay.emit import EventSpec, emit, emit_many
from postrelay.relay.routing import Event, JobRequest, RouteRegistry, default_routes, route
from postrelay.relay.service import Relay, RelayConfig

__all__ = [
    "Event",
    "EventSpec",
    "JobRequest",
    "Relay",
    "RelayConfig",
    "RouteRegistry",
    "default_routes",
    "emit",
    "emit_many",
    "route",
]
