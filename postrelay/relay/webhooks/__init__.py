"""Webhook delivery of outbox events (`outbox_dispatch` jobs), following Standard Webhooks.

- `webhook_add` / `webhook_list` / `webhook_disable` / `webhook_enable` / `webhook_remove`
  manage a tenant's endpoints (CLI: `postrelay webhooks …`).
- The relay side: an `EndpointDirectory` (cached endpoints, refreshed every second and on
  NOTIFY) and `add_webhook_route`, which asks for one job per (event, matching endpoint).
- The worker side: `webhook_registry(engine, allow_private=…)` handles those jobs.
"""

from postrelay.relay.webhooks.directory import DirectoryNotReady, EndpointDirectory
from postrelay.relay.webhooks.endpoints import (
    WebhookEndpoint,
    webhook_add,
    webhook_disable,
    webhook_enable,
    webhook_list,
    webhook_remove,
)
from postrelay.relay.webhooks.handler import (
    WebhookDeliveryError,
    webhook_handler,
    webhook_registry,
)
from postrelay.relay.webhooks.route import (
    WEBHOOK_ROUTE,
    RelayWithWebhooks,
    add_webhook_route,
    webhook_route,
)

__all__ = [
    "WEBHOOK_ROUTE",
    "DirectoryNotReady",
    "EndpointDirectory",
    "RelayWithWebhooks",
    "WebhookDeliveryError",
    "WebhookEndpoint",
    "add_webhook_route",
    "webhook_add",
    "webhook_disable",
    "webhook_enable",
    "webhook_handler",
    "webhook_list",
    "webhook_registry",
    "webhook_remove",
    "webhook_route",
]
