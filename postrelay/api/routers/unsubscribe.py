"""`/u/{token}`: one-click unsubscribe (RFC 8058) for the links in bulk mail.

No login and no CSRF token by design: the signed token is the authority, naming tenant,
recipient and category. POST unsubscribes (idempotent: a second POST changes nothing);
GET only shows a page with a button, because mail scanners follow links. An invalid or
tampered token gets 400 and writes nothing. Not in the OpenAPI document: these are for
mail clients and people, not API clients.
"""

from __future__ import annotations

import html
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from postrelay.core.ids import new_uuid
from postrelay.orchestrator import (
    Feedback,
    SuppressionPolicy,
    UnsubscribeLinks,
    UnsubscribeTokenError,
    record_feedback,
)

router = APIRouter(include_in_schema=False)

PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="robots" content="noindex"><title>{title}</title></head>
<body><main><h1>{title}</h1><p>{text}</p>{form}</main></body></html>"""


# HEAD too (RFC 9110 9.1: a server supports GET and HEAD): link checkers ask with it.
@router.api_route("/u/{token}", methods=["GET", "HEAD"])
def unsubscribe_page(request: Request, token: str) -> HTMLResponse:
    """A confirmation page; unsubscribes nobody by itself."""
    verified = _verified(request, token)
    if isinstance(verified, HTMLResponse):
        return verified
    _tenant, recipient, category = verified
    # No action: the button posts back to the link as opened, under whatever path prefix a
    # proxy serves POSTRELAY_PUBLIC_URL at.
    form = '<form method="post"><button type="submit">Unsubscribe</button></form>'
    return _page(200, "Unsubscribe", f"Stop sending {html.escape(category)} mail to "
                                     f"{html.escape(recipient)}?", form)


@router.post("/u/{token}")
def unsubscribe(request: Request, token: str) -> HTMLResponse:
    """Record the unsubscribe: the address gets no more mail of this category."""
    verified = _verified(request, token)
    if isinstance(verified, HTMLResponse):
        return verified
    tenant, recipient, category = verified
    # Every mail of the category carries this link, so a click has an id of its own: one
    # after the suppression was lifted unsubscribes again. While the address is
    # unsubscribed, a click is left out (record_many), so a second one changes nothing.
    with request.app.state.engine.begin() as conn:
        record_feedback(conn, Feedback(
            kind="unsubscribe", source="one-click", recipient=recipient, tenant_id=tenant,
            category=category, vouched=True, source_event_id=f"{token}:{new_uuid()}"),
            SuppressionPolicy.from_settings(request.app.state.settings))
    return _page(200, "Unsubscribed", f"{html.escape(recipient)} gets no more "
                                      f"{html.escape(category)} mail.")


def _verified(request: Request, token: str) -> tuple[UUID, str, str] | HTMLResponse:
    """(tenant, recipient, category) the token names, or the page that refuses it: 404 where
    no links are set up, 400 for a token this installation did not sign."""
    links: UnsubscribeLinks | None = request.app.state.unsubscribe_links
    if links is None:
        return _page(404, "Not found", "Unsubscribe links are not set up here.")
    try:
        return links.verify(token)
    except UnsubscribeTokenError:
        return _page(400, "Invalid link", "This unsubscribe link is not valid.")


def _page(status: int, title: str, text: str, form: str = "") -> HTMLResponse:
    return HTMLResponse(PAGE.format(title=title, text=text, form=form), status_code=status,
                        headers={"Cache-Control": "no-store"})
