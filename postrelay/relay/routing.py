"""Routes: plain Python that says which jobs an outbox event needs.

    @route("order.placed")
    def reindex_order(event: Event) -> JobRequest:
        return JobRequest("reindex", {"order": event.aggregate_id})

A route returns one JobRequest, several, or None. Its name (the function's, unless given)
names each job's delivery link with the event id (and its idempotency key,
`outbox:<event>:<route>`), so a replayed event can never make a second copy. The relay
knows nothing of what the jobs do: the email orchestrator and webhooks register their
routes through this same mechanism.
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from postrelay.core.errors import ValidationError
from postrelay.core.limits import MAX_NAME_CHARS, checked_text


@dataclass(frozen=True, slots=True)
class Event:
    """One outbox event as the routes see it."""

    id: UUID
    tenant_id: UUID
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: dict[str, Any]
    headers: dict[str, Any]
    created_at: datetime
    attempts: int  # failed routing attempts so far
    seq: int  # insertion order; event order within an aggregate


@dataclass(frozen=True, slots=True)
class JobRequest:
    kind: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    priority: int = 100
    delay: float | None = None
    max_attempts: int | None = None
    key: str | None = None  # tells apart several jobs one route makes for one event
    # Run after the ordered jobs of this aggregate's earlier events have finished.
    ordered: bool = False


MATCHING_CACHE_MAX = 10_000  # event types whose routes are remembered

RouteResult = JobRequest | Iterable[JobRequest] | None
RouteFn = Callable[[Event], RouteResult]
# Run by the relay in each batch's transaction, on its psycopg connection, after the claim
# and before any route is asked: a route that reads state kept in memory (the webhook
# route's endpoint directory) brings it up to what committed before the batch's events.
Prepare = Callable[[Any], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    event_type: str  # exact, or a glob such as "order.*" or "*"
    fn: RouteFn
    prepare: Prepare | None = None

    def matches(self, event_type: str) -> bool:
        return fnmatch.fnmatchcase(event_type, self.event_type)

    def requests(self, event: Event, *, limit: int | None = None) -> list[JobRequest]:
        """The route's requests for `event`, at most `limit` of them: a route that yields
        without end is read no further than the relay's cap needs."""
        result = self.fn(event)
        if result is None:
            return []
        if isinstance(result, JobRequest):
            return [result]
        requests = list(result if limit is None else itertools.islice(result, limit))
        if not all(isinstance(r, JobRequest) for r in requests):
            raise TypeError(f"route {self.name!r} must return JobRequest objects")
        return requests


class RouteRegistry:
    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}
        # event type -> its routes: glob matching per event costs more than the routing.
        self._matching: dict[str, list[Route]] = {}

    def add(self, event_type: str, fn: RouteFn, *, name: str | None = None,
            prepare: Prepare | None = None) -> Route:
        """Register `fn` for `event_type` (exact, or a glob), and `prepare` to run in each
        relay batch before the routes are asked (see Prepare). Refused here, by name: what
        would otherwise fail at routing time, every matching event (or, for an event type
        that is not text, every event) until parked as dead, or the relay's whole batch."""
        if not isinstance(event_type, str) or not event_type:
            raise ValidationError("event_type", "a route needs an event type or pattern, "
                                                f"as a non-empty string; got {event_type!r}")
        checked_text(event_type, "event_type", MAX_NAME_CHARS)
        if not callable(fn):
            raise ValidationError("fn", f"a route must be a function of the event; got {fn!r}")
        if prepare is not None and not callable(prepare):
            raise ValidationError("prepare", f"must be a function of the batch's connection; "
                                             f"got {prepare!r}")
        if name is not None and (not isinstance(name, str) or not name):
            raise ValidationError("name", f"must be a non-empty string; got {name!r}")
        route_name = name or getattr(fn, "__qualname__", None) or repr(fn)
        # The name is stored with each delivery link and is part of each job's idempotency
        # key (with the event id and the request's key), which has a length limit too.
        checked_text(route_name, "name", MAX_NAME_CHARS)
        if route_name in self._routes:
            raise ValidationError("name", f"a route named {route_name!r} is registered already")
        self._routes[route_name] = Route(route_name, event_type, fn, prepare)
        self._matching.clear()
        return self._routes[route_name]

    def route(self, event_type: str, *, name: str | None = None) -> Callable[[RouteFn], RouteFn]:
        if callable(event_type):
            # `@route` without its argument would make the function the event type and
            # replace it with the decorator, registering nothing and saying nothing.
            raise ValidationError("event_type", "@route needs the event type it routes: "
                                                "@route(\"order.placed\")")

        def decorate(fn: RouteFn) -> RouteFn:
            self.add(event_type, fn, name=name)
            return fn

        return decorate

    def merged(self, other: RouteRegistry) -> RouteRegistry:
        """A new registry with this one's routes and `other`'s (names must not clash)."""
        merged = RouteRegistry()
        for r in (*self._routes.values(), *other._routes.values()):
            merged.add(r.event_type, r.fn, name=r.name, prepare=r.prepare)
        return merged

    def preparers(self) -> list[Prepare]:
        """The routes' `prepare` functions, each once, in registration order."""
        return list(dict.fromkeys(r.prepare for r in self._routes.values()
                                  if r.prepare is not None))

    def matching(self, event_type: str) -> list[Route]:
        routes = self._matching.get(event_type)
        if routes is None:
            routes = [r for r in self._routes.values() if r.matches(event_type)]
            if len(self._matching) >= MATCHING_CACHE_MAX:  # event types made up on the fly
                self._matching.clear()
            self._matching[event_type] = routes
        return routes

    def __len__(self) -> int:
        return len(self._routes)


default_routes = RouteRegistry()


def route(event_type: str, *, name: str | None = None) -> Callable[[RouteFn], RouteFn]:
    """Register a route for `event_type` (or a glob) in the default registry."""
    return default_routes.route(event_type, name=name)
