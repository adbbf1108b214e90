"""Provider webhooks: delivery feedback from Amazon SES (through SNS), Postmark and
SendGrid, recorded through the same path as bounce mail (`record_feedback`), so matching,
effects and dedupe are one.

The providers call these, so no API key: each proves itself instead (SNS's signature and
our topic, Postmark's basic auth, SendGrid's ECDSA signature). A request that does not is
401 and writes nothing; a malformed body is 400 naming the field; a webhook whose setting is
absent is 404. What a delivery holds is recorded in one transaction: all of it or none, and
a provider's retry changes nothing (each report carries the provider's event id). Not in
the OpenAPI document: these speak the providers' formats to the providers.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from postrelay.api.errors import ApiError
from postrelay.core import jsontext
from postrelay.core.errors import ValidationError
from postrelay.core.telemetry import event
from postrelay.orchestrator import (
    SENDGRID_SIGNATURE_HEADER,
    SENDGRID_TIMESTAMP_HEADER,
    ProviderWebhooks,
    WebhookAuthError,
    WebhookUnavailableError,
    postmark_reports,
    record_batch,
    sendgrid_reports,
    ses_reports,
    summary,
)

PREFIX = "/v1/email/feedback"
router = APIRouter(prefix=PREFIX, include_in_schema=False)


@router.post("/ses")
async def ses(request: Request) -> JSONResponse:
    """An SNS message: a subscription handshake, or an SES notification."""
    hooks = _hooks(request, "ses")
    body = await request.body()
    return await run_in_threadpool(_guarded, request, "ses", _ses, hooks, body)


@router.post("/postmark")
async def postmark(request: Request) -> JSONResponse:
    """One Postmark webhook record (Bounce, SpamComplaint, Delivery, SubscriptionChange)."""
    hooks = _hooks(request, "postmark")
    body = await request.body()
    return await run_in_threadpool(_guarded, request, "postmark", _postmark, hooks, body)


@router.post("/sendgrid")
async def sendgrid(request: Request) -> JSONResponse:
    """A batch of SendGrid events."""
    hooks = _hooks(request, "sendgrid")
    body = await request.body()
    return await run_in_threadpool(_guarded, request, "sendgrid", _sendgrid, hooks, body)


def _ses(request: Request, hooks: ProviderWebhooks, body: bytes) -> dict[str, Any]:
    assert hooks.sns is not None
    message = _json(body, obj=True)
    hooks.sns.verify(message)
    kind = message["Type"]
    if kind == "SubscriptionConfirmation":
        hooks.sns.confirm(message)
        event("postrelay.feedback.sns_subscribed", logging.INFO, topic=message["TopicArn"])
        return {"confirmed": True}
    if kind == "UnsubscribeConfirmation":  # ours to confirm again only by hand, if wanted
        event("postrelay.feedback.sns_unsubscribed", logging.WARNING,
              topic=message["TopicArn"])
        return {"confirmed": False}
    # No provider nests past MAX_DEPTH, and what a report keeps of a deeper payload
    # could not be written: a 500 the provider retries for days (parse_document's rules).
    notification = jsontext.parse_document(message["Message"], "Message")
    reports, ignored = ses_reports(notification, message["MessageId"])
    return summary(record_batch(request.app.state.engine, reports, hooks.policy), ignored)


def _postmark(request: Request, hooks: ProviderWebhooks, body: bytes) -> dict[str, Any]:
    assert hooks.postmark is not None
    throttle = request.app.state.auth_throttle
    client = request.client.host if request.client else None
    refusal = throttle.check(client)
    if refusal is not None:  # the same bound as a wrong API key: guessing is slow
        raise ApiError(429, refusal.message, headers={"Retry-After": str(refusal.retry_after)})
    presented = request.headers.get("authorization")
    try:
        hooks.postmark.check(presented)
    except WebhookAuthError:
        throttle.failed(client, presented or "")
        raise
    throttle.succeeded(client)
    reports, ignored = postmark_reports(_json(body))
    return summary(record_batch(request.app.state.engine, reports, hooks.policy), ignored)


def _sendgrid(request: Request, hooks: ProviderWebhooks, body: bytes) -> dict[str, Any]:
    assert hooks.sendgrid is not None
    hooks.sendgrid.verify(body, request.headers.get(SENDGRID_SIGNATURE_HEADER),
                          request.headers.get(SENDGRID_TIMESTAMP_HEADER))
    reports, ignored = sendgrid_reports(_json(body))
    return summary(record_batch(request.app.state.engine, reports, hooks.policy), ignored)


def _guarded(request: Request, provider: str, handle: Any, hooks: ProviderWebhooks,
             body: bytes) -> JSONResponse:
    """The provider's handler, with its refusals as answers: 401 (authentication), 503
    (verification not possible now, so the provider retries)."""
    try:
        done = handle(request, hooks, body)
    except WebhookAuthError as exc:
        event("postrelay.feedback.webhook_refused", logging.WARNING, provider=provider,
              reason=str(exc), client=request.client.host if request.client else None)
        headers = {"WWW-Authenticate": 'Basic realm="postrelay"'} \
            if provider == "postmark" else None
        raise ApiError(401, f"{provider} webhook: {exc}", headers=headers) from None
    except WebhookUnavailableError as exc:
        event("postrelay.feedback.webhook_unavailable", logging.WARNING, provider=provider,
              reason=str(exc))
        raise ApiError(503, f"{provider} webhook: {exc}") from None
    return JSONResponse({"data": done, "meta": None})


def _hooks(request: Request, provider: str) -> ProviderWebhooks:
    hooks: ProviderWebhooks = request.app.state.provider_webhooks
    if getattr(hooks, "sns" if provider == "ses" else provider) is None:
        setting = {"ses": "POSTRELAY_FEEDBACK_SES_TOPIC_ARNS",
                   "postmark": "POSTRELAY_FEEDBACK_POSTMARK_USERNAME and _PASSWORD",
                   "sendgrid": "POSTRELAY_FEEDBACK_SENDGRID_PUBLIC_KEY"}[provider]
        raise ApiError(404, f"the {provider} feedback webhook is not configured ({setting})")
    return hooks


def _json(body: bytes, *, obj: bool = False) -> Any:
    found = jsontext.parse_document(body, "body")
    if obj and not isinstance(found, dict):
        raise ValidationError("body", "must be a JSON object")
    return found
