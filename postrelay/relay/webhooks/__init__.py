"""Webhook delivery of outbox events (`outbox_dispatch` jobs), following Standard Webhooks.

- `webhook_add` / `webhook_list` / `webhook_get` / `webhook_disable` / `webhook_enable`
  / `webhook_remove` / `webhook_set_ca` manage a tenant's endpoints (CLI: `postrelay
  webhooks …`, API: `/v1/functions/webhooks`); an endpoint behind a private CA trusts that
  CA (trust.py).
- The relay side: an `EndpointDirectory` (cached endpoints, refreshed every second and on
  NOTIFY, and checked by each relay batch before it routes) and `add_webhook_route`, which
  asks for one job per (event, matching endpoint).
- The worker side: `webhook_registry(engine, allow_private=…)` handles those jobs, sending
  each receiver's deliveries on the connections it keeps open (pool.py); its closer closes
  them when the worker stops.
"""

from postrelay.relay.webhooks.directory import DirectoryNotReady, EndpointDirectory

# Exported on purpose for the relay package's users: the attempts log and its retention.
from postrelay.relay.webhooks.endpoints import (
    WebhookAttempt,
    WebhookEndpoint,
    webhook_add,
    webhook_attempts,
    webhook_disable,
    webhook_enable,
    webhook_get,
    webhook_list,
    webhook_remove,
    webhook_set_ca,
)
from postrelay.relay.webhooks.handler import (
    WebhookDeliveryError,
    webhook_handler,
    webhook_registry,
)
from postrelay.relay.webhooks.retention import webhook_attempt_delete_batch
from postrelay.relay.webhooks.route import (
    WEBHOOK_ROUTE,
    RelayWithWebhooks,
    add_webhook_route,
    webhook_route,
)

__all__ = [
    "DirectoryNotReady",
    "EndpointDirectory",
    "RelayWithWebhooks",
    "WEBHOOK_ROUTE",
    "WebhookAttempt",
    "WebhookDeliveryError",
    "WebhookEndpoint",
    "add_webhook_route",
    "webhook_add",
    "webhook_attempt_delete_batch",
    "webhook_attempts",
    "webhook_disable",
    "webhook_enable",
    "webhook_get",
    "webhook_handler",
    "webhook_list",
    "webhook_registry",
    "webhook_remove",
    "webhook_route",
    "webhook_set_ca",
]
