"""What the clients' webhook endpoint methods send (the rest: _calls.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import UUID

from postrelay.client._calls import Call, _body, _id, _nothing, _object, _objects, _uuid

WEBHOOKS = "/v1/functions/webhooks"

# As the API answers them, in snake_case like the outbox: an endpoint (never its secret or
# its CA's certificates, `private_ca` says whether it has one; `disabled_by` who disabled
# it), `{"endpoint", "secret"}` for the one just added, and a delivery attempt.
Webhook = dict[str, Any]
AddedWebhook = dict[str, Any]
WebhookAttempt = dict[str, Any]


def list_webhooks(tenant_id: UUID | str | None) -> Call[list[Webhook]]:
    return Call("GET", WEBHOOKS, _objects, params=_body(tenantId=_uuid(tenant_id)))


def get_webhook(endpoint_id: UUID | str) -> Call[Webhook]:
    return Call("GET", f"{WEBHOOKS}/{_id(endpoint_id, 'endpoint_id')}", _object)


def add_webhook(url: str, event_types: Iterable[str] | None, ca_pem: str | None,
                tenant_id: UUID | str | None) -> Call[AddedWebhook]:
    # One string is sent as it is, for the API to refuse naming eventTypes: list() would
    # turn "order.*" into seven one-letter types.
    types = event_types if event_types is None or isinstance(event_types, str) \
        else list(event_types)
    return Call("POST", WEBHOOKS, _added, json=_body(
        url=url, eventTypes=types, caPem=ca_pem, tenantId=_uuid(tenant_id)))


def _added(data: Any) -> AddedWebhook:
    added = _object(data)
    if not isinstance(added.get("secret"), str):
        raise ValueError("expected the new endpoint's secret")
    _object(added.get("endpoint"))
    return added


def disable_webhook(endpoint_id: UUID | str) -> Call[Webhook]:
    return Call("POST", f"{WEBHOOKS}/{_id(endpoint_id, 'endpoint_id')}/disable", _object)


def enable_webhook(endpoint_id: UUID | str) -> Call[Webhook]:
    return Call("POST", f"{WEBHOOKS}/{_id(endpoint_id, 'endpoint_id')}/enable", _object)


def delete_webhook(endpoint_id: UUID | str) -> Call[None]:
    return Call("DELETE", f"{WEBHOOKS}/{_id(endpoint_id, 'endpoint_id')}", _nothing)


def list_webhook_attempts(endpoint_id: UUID | str, limit: int) -> Call[list[WebhookAttempt]]:
    return Call("GET", f"{WEBHOOKS}/{_id(endpoint_id, 'endpoint_id')}/attempts", _objects,
                params={"limit": limit})
