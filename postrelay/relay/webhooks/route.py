"""The built-in webhook route: one `outbox_dispatch` job per (event, matching endpoint).

    directory = EndpointDirectory(engine, listen_url=db.libpq_url)
    add_webhook_route(routes, directory)
    relay = Relay(engine, routes, listen_url=db.libpq_url)
    await RelayWithWebhooks(relay, directory).start()

Each job's key is the endpoint id, so its idempotency key is
`outbox:<event id>:postrelay.webhooks:<endpoint id>`, naming its delivery link: replaying
the event never makes a second delivery job for the same endpoint. Matching reads the
relay's EndpointDirectory, brought up to each batch's events before they are routed (see
there); the handler re-reads the endpoint before sending.
"""

from __future__ import annotations

from dataclasses import dataclass

from postrelay.relay.routing import Event, JobRequest, Route, RouteFn, RouteRegistry
from postrelay.relay.service import Relay
from postrelay.relay.webhooks.directory import EndpointDirectory

WEBHOOK_ROUTE = "postrelay.webhooks"
DISPATCH_KIND = "outbox_dispatch"
CHANNEL = "webhook"  # outbox_dispatch may later carry other channels (a broker)


def webhook_route(
    directory: EndpointDirectory, *, priority: int = 100, max_attempts: int | None = None
) -> RouteFn:
    """A route function that asks for one delivery job per matching endpoint."""

    def route(event: Event) -> list[JobRequest]:
        return [
            JobRequest(
                DISPATCH_KIND,
                {"channel": CHANNEL, "event_id": str(event.id), "endpoint_id": str(e.id)},
                priority=priority,
                max_attempts=max_attempts,
                key=str(e.id),
            )
            for e in directory.matching(event.tenant_id, event.event_type)
        ]

    return route


def add_webhook_route(
    routes: RouteRegistry, directory: EndpointDirectory, *, priority: int = 100,
    max_attempts: int | None = None,
) -> Route:
    """Register the webhook route (every event type; each endpoint filters) in `routes`;
    each relay batch brings the directory up to its events first (`catch_up`)."""
    fn = webhook_route(directory, priority=priority, max_attempts=max_attempts)
    return routes.add("*", fn, name=WEBHOOK_ROUTE, prepare=directory.catch_up)


@dataclass
class RelayWithWebhooks:
    """A relay whose endpoint directory is loaded before the first batch and stopped after
    the last, so no event is ever routed without a snapshot."""

    relay: Relay
    directory: EndpointDirectory

    async def start(self) -> None:
        await self.directory.start()
        await self.relay.start()

    async def stop(self) -> None:
        await self.relay.stop()
        await self.directory.stop()
