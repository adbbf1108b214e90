"""The transactional outbox: `emit` in the caller's transaction; the relay turns events into
jobs through routes. Uses only the queue's public names."""

# Exported on purpose for the packages above: the operator's functions (CLI, API, dashboard),
# the route type the orchestrator builds on, retention for the runtime, and webhook delivery.
from postrelay.relay.admin import (
    outbox_event_get,
    outbox_replay,
    outbox_replay_count,
    outbox_status,
)
from postrelay.relay.emit import EventSpec, emit, emit_async, emit_many, emit_many_async
from postrelay.relay.retention import EVENT_READERS, OUTBOX_TARGET, delete_handled_batch
from postrelay.relay.routing import Event, JobRequest, Route, RouteRegistry, default_routes, route
from postrelay.relay.service import Relay, RelayConfig
from postrelay.relay.webhooks import (
    EndpointDirectory,
    RelayWithWebhooks,
    WebhookAttempt,
    WebhookEndpoint,
    add_webhook_route,
    webhook_add,
    webhook_attempt_delete_batch,
    webhook_attempts,
    webhook_disable,
    webhook_enable,
    webhook_get,
    webhook_list,
    webhook_registry,
    webhook_remove,
    webhook_set_ca,
)

__all__ = [
    "EVENT_READERS",
    "EndpointDirectory",
    "Event",
    "EventSpec",
    "JobRequest",
    "OUTBOX_TARGET",
    "Relay",
    "RelayConfig",
    "RelayWithWebhooks",
    "Route",
    "RouteRegistry",
    "WebhookAttempt",
    "WebhookEndpoint",
    "add_webhook_route",
    "default_routes",
    "delete_handled_batch",
    "emit",
    "emit_async",
    "emit_many",
    "emit_many_async",
    "outbox_event_get",
    "outbox_replay",
    "outbox_replay_count",
    "outbox_status",
    "route",
    "webhook_add",
    "webhook_attempt_delete_batch",
    "webhook_attempts",
    "webhook_disable",
    "webhook_enable",
    "webhook_get",
    "webhook_list",
    "webhook_registry",
    "webhook_remove",
    "webhook_set_ca",
]
