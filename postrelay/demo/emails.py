"""The demo's email traffic: outbox events of three tenants, the routes that turn them into
messages, and the mailboxes of the embedded SMTP sink that refuse them.

Per tenant: five sign-ups (one to a mailbox that does not exist: 550 5.1.1, bounced and
suppressed) and two invoices (one to a domain whose policy blocks us: 554 5.7.1, never
suppressed; each with a Bcc to the archive, so that one is partly delivered). The first
tenant also gets a weekly digest whose template needs a variable the event lacks: the
render fails and the job goes to the DLQ.
"""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

from postrelay.orchestrator import email_route
from postrelay.relay import EventSpec, RouteRegistry

TEMPLATES = Path(__file__).parent / "templates"
SENDER = "postrelay demo <demo@postrelay.example>"
TENANTS = ("acme", "globex", "initech")
MISSING = "nobody@{tenant}.example"  # refused: 550 5.1.1
BLOCKED = "ap@blocked.example"  # refused: 554 5.7.1
ARCHIVE = "archive@{tenant}.example"


def demo_routes(routes: RouteRegistry | None = None) -> RouteRegistry:
    """The demo's three email routes, in `routes` (a new registry when not given)."""
    routes = routes if routes is not None else RouteRegistry()
    email_route("user.signed_up", template="welcome", to="user.email", category="onboarding",
                priority=50, routes=routes)
    email_route("invoice.issued", template="invoice", to="customer.email",
                bcc=lambda e: ARCHIVE.format(tenant=e.payload["tenant"]), category="billing",
                routes=routes)
    email_route("digest.due", template="weekly_digest", to="user.email", category="digest",
                priority=200, routes=routes)
    return routes


def sample_events(tenant_id: UUID, tenant: str) -> list[EventSpec]:
    common = {"product": f"{tenant.title()} Cloud", "tenant": tenant,
              "sign_in_url": f"https://{tenant}.example/sign-in"}
    users = [(f"User {n}", f"user{n}@{tenant}.example") for n in range(1, 5)]
    users.append(("Nobody", MISSING.format(tenant=tenant)))
    events = [
        EventSpec("user.signed_up", {**common, "user": {"name": name, "email": email}},
                  tenant_id=tenant_id, aggregate_type="user", aggregate_id=email)
        for name, email in users
    ]
    for n, email in enumerate((f"billing@{tenant}.example", BLOCKED), start=1):
        number = f"{tenant[:3].upper()}-{n:04d}"
        invoice = {"number": number, "total": f"€{120 * n},00",
                   "due": "2026-12-31",
                   "lines": [{"item": "Subscription", "amount": f"€{100 * n},00"},
                             {"item": "Support", "amount": f"€{20 * n},00"}]}
        events.append(EventSpec(
            "invoice.issued",
            {**common, "customer": {"name": f"{tenant.title()} Billing", "email": email},
             "invoice": invoice},
            tenant_id=tenant_id, aggregate_type="invoice", aggregate_id=number))
    if tenant == TENANTS[0]:  # one digest, whose template needs what the event lacks
        events.append(EventSpec(
            "digest.due", {**common, "user": {"name": "User 1", "email": users[0][1]}},
        tenant_id=tenant_id, aggregate_type="user", aggregate_id=users[0][1]))
    return events
