"""The transactional outbox: `emit` in the caller's transaction; the relay turns events into
jobs through routes. Uses only the queue's public names."""

from postrelay.relay.emit import emit
from postrelay.relay.routing import Event, JobRequest, RouteRegistry, default_routes, route
from postrelay.relay.service import Relay, RelayConfig

__all__ = ["Event", "JobRequest", "Relay", "RelayConfig", "RouteRegistry", "default_routes",
           "emit", "route"]
