"""The tenant walk's table: for every route of the served application (the HTTP API and
every page and form of the dashboard), how tenant A's credentials take it against tenant B's
ids, and which answers are allowed; tenant B's rows and what would betray them in an answer.
tests/dashboard/test_tenant_walk.py walks it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

import httpx

from tests.dashboard.conftest import csrf_of, login_token, sign_in

MARK = "globex-secret-7f3a"  # in every text field of tenant B's rows; A never sends it
B_CRON = "gx-nightly"  # names and keys A may send (and see echoed in a refusal)
B_KEY = "gx-order-42"
B_RECIPIENT = "ann@gx-mail.example"
REFUSED = {403, 404}


@dataclass
class B:
    """Tenant B's rows, and everything that would betray them in an answer."""

    tenant: uuid.UUID
    dead_job: uuid.UUID
    done_job: uuid.UUID
    pending_job: uuid.UUID
    email_log: uuid.UUID
    dead_event: uuid.UUID
    handled_event: uuid.UUID
    cron_name: str
    idempotency_key: str
    webhook: uuid.UUID
    webhook_secret: str

    def secrets(self) -> list[str]:
        ids = (self.tenant, self.dead_job, self.done_job, self.pending_job, self.email_log,
               self.dead_event, self.handled_event, self.webhook)
        return [MARK, "globex", self.cron_name, self.idempotency_key, B_RECIPIENT,
                self.webhook_secret, *(str(i) for i in ids)]


@dataclass
class A:
    """A's own rows that point at B's ids (as an event id copied from a payload would, or
    a delivery link written by hand): A may read them, but never B's rows through them."""

    email_log: uuid.UUID  # event_id and job_id are B's
    job: uuid.UUID  # linked to B's event
    event: uuid.UUID  # linked to B's job


@dataclass
class Walk:
    api: httpx.Client  # tenant A's key
    dash: httpx.Client  # tenant A's dashboard session
    url: str
    a_key: str
    a: A
    b: B

    def csrf(self) -> str:
        return csrf_of(self.dash)

    def form(self, path: str, **fields: Any) -> httpx.Response:
        return self.dash.post(path, data={"csrf": self.csrf(), **fields})


# Each entry: the route as (method, path template) and how to exercise it with A's
# credentials against B's ids. A probe returns its answers and the statuses allowed for
# them; `OWN` means "A's own view": 200 (or a redirect back into A's pages).
# A third element names values of B's that the answer may show because A's own row holds
# them (an id A's payload carried).
Probe = Callable[[Walk], list[tuple[Any, ...]]]
OWN = {200, 303}


def one(response: httpx.Response, allowed: set[int]) -> list[tuple[httpx.Response, set[int]]]:
    return [(response, allowed)]


def public(path: str) -> Probe:
    """A route that needs no credentials and shows no tenant's data."""
    return lambda w: one(w.api.get(path), {200})


WALK: dict[tuple[str, str], Probe] = {
    # --- the API: public and service-role routes -----------------------------------------
    ("GET", "/openapi.json"): public("/openapi.json"),
    ("GET", "/docs"): public("/docs"),
    ("GET", "/docs/oauth2-redirect"): public("/docs/oauth2-redirect"),
    ("GET", "/redoc"): public("/redoc"),
    ("GET", "/healthz"): public("/healthz"),
    ("GET", "/readyz"): public("/readyz"),
    # One-click unsubscribe: no credentials, the signed token is the authority; a token that
    # is not one of this installation's (or no links set up) reaches nobody's data.
    ("GET", "/u/{token}"): lambda w: one(w.api.get(f"/u/{w.b.tenant}"), {400, 404}),
    ("POST", "/u/{token}"): lambda w: one(w.api.post(f"/u/{w.b.tenant}"), {400, 404}),
    ("GET", "/metrics"): lambda w: one(w.api.get("/metrics"), {403}),  # every tenant's counts
    # Provider webhooks: no API key, the provider's signature or password is the authority,
    # and the answer is counts only. Not configured here: 404 whatever the request says
    # about B's message (tests/feedback/test_webhook_*.py cover them configured).
    ("POST", "/v1/email/feedback/ses"): lambda w: one(w.api.post(
        "/v1/email/feedback/ses", json={"Type": "Notification", "TopicArn": MARK}), {404}),
    ("POST", "/v1/email/feedback/postmark"): lambda w: one(w.api.post(
        "/v1/email/feedback/postmark", json={"RecordType": "Bounce", "Email": B_RECIPIENT}),
        {404}),
    ("POST", "/v1/email/feedback/sendgrid"): lambda w: one(w.api.post(
        "/v1/email/feedback/sendgrid", json=[{"event": "bounce", "email": B_RECIPIENT}]),
        {404}),
    # --- the API: jobs and the DLQ -------------------------------------------------------
    ("POST", "/v1/functions/jobs"): lambda w: [
        # Naming B's tenant is refused as a bad field, and so is a repeat of B's key.
        (w.api.post("/v1/functions/jobs", json={"kind": "reindex",
                                                "tenantId": str(w.b.tenant)}), {400}),
        (w.api.post("/v1/functions/jobs", json={"kind": "reindex",
                                                "idempotencyKey": w.b.idempotency_key}),
         {201}),  # a new job of A's: B's key is no lookup into B's jobs
    ],
    ("GET", "/v1/functions/jobs"): lambda w: [
        *[(w.api.get("/v1/functions/jobs", params={"status": s}), {200})
          for s in ("pending", "done", "dlq")],
        (w.api.get("/v1/functions/jobs", params={"limit": 500}), {200}),
    ],
    ("GET", "/v1/functions/jobs/{id}"): lambda w: [
        (w.api.get(f"/v1/functions/jobs/{j}"), {404})
        for j in (w.b.dead_job, w.b.done_job, w.b.pending_job)],
    ("GET", "/v1/functions/jobs/dlq"): lambda w: one(w.api.get("/v1/functions/jobs/dlq"),
                                                     {200}),
    ("POST", "/v1/functions/jobs/dlq/requeue"): lambda w: one(
        w.api.post("/v1/functions/jobs/dlq/requeue"), {200}),
    ("POST", "/v1/functions/jobs/{id}/retry"): lambda w: one(
        w.api.post(f"/v1/functions/jobs/{w.b.dead_job}/retry"), {404}),
    ("POST", "/v1/functions/jobs/{id}/cancel"): lambda w: [
        (w.api.post(f"/v1/functions/jobs/{j}/cancel"), {404})
        for j in (w.b.pending_job, w.b.done_job, w.b.dead_job)],
    ("POST", "/v1/functions/jobs/cancel"): lambda w: [
        # Scoped to A's own jobs: B's pending job stays pending (checked after the walk).
        (w.api.post("/v1/functions/jobs/cancel", json={"kind": "reindex"}), {200}),
        (w.api.post("/v1/functions/jobs/cancel", json={"tenantId": str(w.b.tenant)}), {400}),
    ],
    # --- the API: pauses (B has one of its own, which A must neither see nor lift) -----
    ("GET", "/v1/functions/pauses"): lambda w: one(w.api.get("/v1/functions/pauses"), {200}),
    ("POST", "/v1/functions/pauses"): lambda w: [
        (w.api.post("/v1/functions/pauses", json={"tenantId": str(w.b.tenant)}), {400}),
        (w.api.post("/v1/functions/pauses", json={"all": True}), {400}),
        (w.api.post("/v1/functions/pauses", json={"kind": "bulk_import"}), {201}),  # A's own
    ],
    ("POST", "/v1/functions/pauses/resume"): lambda w: [
        (w.api.post("/v1/functions/pauses/resume",
                    json={"tenantId": str(w.b.tenant), "kind": "reindex"}), {400}),
        (w.api.post("/v1/functions/pauses/resume", json={"kind": "reindex"}), {404}),
    ],
    # --- the API: limits (B has one of its own) -----------------------------------------
    ("GET", "/v1/functions/limits"): lambda w: one(w.api.get("/v1/functions/limits"), {200}),
    ("POST", "/v1/functions/limits"): lambda w: [
        (w.api.post("/v1/functions/limits", json={"kind": "reindex", "concurrency": 1,
                                                  "tenantId": str(w.b.tenant)}), {400}),
        (w.api.post("/v1/functions/limits", json={"kind": "bulk_import", "concurrency": 2}),
         {200}),  # A's own
    ],
    ("POST", "/v1/functions/limits/remove"): lambda w: [
        (w.api.post("/v1/functions/limits/remove",
                    json={"kind": "reindex", "tenantId": str(w.b.tenant)}), {400}),
        (w.api.post("/v1/functions/limits/remove", json={"kind": "reindex"}), {404}),
    ],
    ("DELETE", "/v1/functions/jobs/{id}"): lambda w: one(
        w.api.delete(f"/v1/functions/jobs/{w.b.dead_job}"), {404}),
    # --- the API: cron -------------------------------------------------------------------
    ("POST", "/v1/functions/cron"): lambda w: [
        (w.api.post("/v1/functions/cron", json={
            "name": w.b.cron_name, "schedule": "0 3 * * *", "kind": "reindex",
            "tenantId": str(w.b.tenant)}), {400}),
        # B's name is free for A: a 201, never a 409 that would betray B's entry (and A's
        # entry is deleted again, so that the delete probes meet B's name alone).
        (w.api.post("/v1/functions/cron", json={
            "name": w.b.cron_name, "schedule": "0 3 * * *", "kind": "reindex"}), {201}),
        (w.api.delete(f"/v1/functions/cron/{w.b.cron_name}"), {200}),
    ],
    ("GET", "/v1/functions/cron"): lambda w: one(w.api.get("/v1/functions/cron"), {200}),
    ("DELETE", "/v1/functions/cron/{name}"): lambda w: [
        (w.api.delete(f"/v1/functions/cron/{w.b.cron_name}"), {404}),
        (w.api.delete(f"/v1/functions/cron/{w.b.cron_name}",
                      params={"tenantId": str(w.b.tenant)}), {400}),
    ],
    # --- the API: the outbox -------------------------------------------------------------
    ("GET", "/v1/functions/outbox/status"): lambda w: one(
        w.api.get("/v1/functions/outbox/status"), {200}),
    ("GET", "/v1/functions/outbox/events/{id}"): lambda w: [
        *[(w.api.get(f"/v1/functions/outbox/events/{e}"), {404})
          for e in (w.b.dead_event, w.b.handled_event)],
        # A's event linked to B's job: the link is A's row, B's job must not show.
        (w.api.get(f"/v1/functions/outbox/events/{w.a.event}"), {200}),
    ],
    ("POST", "/v1/functions/outbox/replay"): lambda w: [
        (w.api.post("/v1/functions/outbox/replay", json={"eventId": str(w.b.dead_event)}),
         {404}),
        (w.api.post("/v1/functions/outbox/replay",
                    json={"since": "2000-01-01T00:00:00Z"}), {200}),  # A's events only
    ],
    # --- the API: webhook endpoints (B has one, with a delivery attempt) -----------------
    ("GET", "/v1/functions/webhooks"): lambda w: [
        (w.api.get("/v1/functions/webhooks"), {200}),
        (w.api.get("/v1/functions/webhooks", params={"tenantId": str(w.b.tenant)}), {400}),
    ],
    ("POST", "/v1/functions/webhooks"): lambda w: [
        (w.api.post("/v1/functions/webhooks", json={"url": "https://hooks.acme.example/",
                                                    "tenantId": str(w.b.tenant)}), {400}),
    ],
    ("GET", "/v1/functions/webhooks/{id}"): lambda w: one(
        w.api.get(f"/v1/functions/webhooks/{w.b.webhook}"), {404}),
    ("POST", "/v1/functions/webhooks/{id}/disable"): lambda w: one(
        w.api.post(f"/v1/functions/webhooks/{w.b.webhook}/disable"), {404}),
    ("POST", "/v1/functions/webhooks/{id}/enable"): lambda w: one(
        w.api.post(f"/v1/functions/webhooks/{w.b.webhook}/enable"), {404}),
    ("DELETE", "/v1/functions/webhooks/{id}"): lambda w: one(
        w.api.delete(f"/v1/functions/webhooks/{w.b.webhook}"), {404}),
    ("GET", "/v1/functions/webhooks/{id}/attempts"): lambda w: one(
        w.api.get(f"/v1/functions/webhooks/{w.b.webhook}/attempts"), {404}),
    # --- the dashboard -------------------------------------------------------------------
    ("GET", "/dashboard/login"): lambda w: one(w.dash.get("/dashboard/login"), {303}),
    ("POST", "/dashboard/login"): lambda w: one(_sign_in_again(w), {303}),
    ("POST", "/dashboard/logout"): lambda w: one(_sign_out_elsewhere(w), {303}),
    ("GET", "/dashboard/"): lambda w: one(w.dash.get("/dashboard/",
                                                     params={"tenant": str(w.b.tenant)}),
                                          {200}),
    ("GET", "/dashboard/panels"): lambda w: one(w.dash.get("/dashboard/panels"), {200}),
    ("GET", "/dashboard/jobs"): lambda w: [
        *[(w.dash.get("/dashboard/jobs", params={"status": s, "tenant": str(w.b.tenant)}),
           {200}) for s in ("pending", "running", "done", "failed", "dlq")],
        (w.dash.get("/dashboard/jobs", params={"q": str(w.b.dead_job)}), {200}),
        (w.dash.get("/dashboard/jobs", params={"q": w.b.idempotency_key}), OWN),
    ],
    ("GET", "/dashboard/jobs/{job_id}"): lambda w: [
        *[(w.dash.get(f"/dashboard/jobs/{j}"), {404})
          for j in (w.b.dead_job, w.b.done_job, w.b.pending_job)],
        (w.dash.get(f"/dashboard/jobs/{w.a.job}"), {200}),  # linked to B's event
    ],
    ("GET", "/dashboard/dlq"): lambda w: one(
        w.dash.get("/dashboard/dlq", params={"tenant": str(w.b.tenant)}), {200}),
    ("POST", "/dashboard/dlq/confirm"): lambda w: [
        (w.form("/dashboard/dlq/confirm", action="retry", ids=str(w.b.dead_job)), {303}),
        (w.form("/dashboard/dlq/confirm", action="discard", scope="matching",
                tenant=str(w.b.tenant)), OWN),
    ],
    ("GET", "/dashboard/pauses"): lambda w: one(w.dash.get("/dashboard/pauses"), {200}),
    ("POST", "/dashboard/pauses"): lambda w: [
        # The tenant field is ignored for a tenant session: A's own scope, never B's.
        (w.form("/dashboard/pauses", action="resume", kind="reindex",
                tenant=str(w.b.tenant)), {404}),
        (w.form("/dashboard/pauses", action="pause", kind="virus_scan",
                tenant=str(w.b.tenant)), OWN),
        (w.form("/dashboard/pauses", action="pause", all="1"), {400}),
    ],
    ("POST", "/dashboard/limits"): lambda w: [
        # As with pauses: a tenant session's scope is its own tenant, whatever it sends.
        (w.form("/dashboard/limits", action="remove", kind="reindex",
                tenant=str(w.b.tenant)), {404}),
        (w.form("/dashboard/limits", action="set", kind="virus_scan", concurrency="2",
                tenant=str(w.b.tenant)), OWN),
    ],
    ("POST", "/dashboard/jobs/{job_id}/cancel"): lambda w: [
        (w.form(f"/dashboard/jobs/{j}/cancel"), {404})
        for j in (w.b.pending_job, w.b.done_job, w.b.dead_job)],
    ("POST", "/dashboard/dlq/apply"): lambda w: [
        (w.form("/dashboard/dlq/apply", action="discard", ids=str(w.b.dead_job)), {303}),
        (w.form("/dashboard/dlq/apply", action="retry", scope="matching",
                tenant=str(w.b.tenant)), {303}),
    ],
    ("GET", "/dashboard/cron"): lambda w: one(w.dash.get("/dashboard/cron"), {200}),
    ("POST", "/dashboard/cron"): lambda w: [
        (w.form("/dashboard/cron", name="walk-b", schedule="0 3 * * *", kind="reindex",
                tenant=str(w.b.tenant)), {400}),
        (w.form("/dashboard/cron", name=w.b.cron_name, schedule="0 3 * * *",
                kind="reindex"), {303}),
        (w.form(f"/dashboard/cron/{w.b.cron_name}/delete"), {303}),
    ],
    ("POST", "/dashboard/cron/{name}/delete"): lambda w: [
        (w.form(f"/dashboard/cron/{w.b.cron_name}/delete"), {404}),
        (w.form(f"/dashboard/cron/{w.b.cron_name}/delete", tenant=str(w.b.tenant)),
         {404}),
    ],
    ("GET", "/dashboard/outbox"): lambda w: one(w.dash.get("/dashboard/outbox"), {200}),
    ("POST", "/dashboard/outbox/replay"): lambda w: [
        (w.form("/dashboard/outbox/replay", event_id=str(w.b.dead_event)), {404}),
        # Counted for A's own events alone, then confirmed: B's stay as they were.
        (w.form("/dashboard/outbox/replay", since="2000-01-01T00:00"), {200}),
        (w.form("/dashboard/outbox/replay", since="2000-01-01T00:00", confirmed="1"), {303}),
        (w.form("/dashboard/outbox/replay", dead="1", confirmed="1"), {303}),
    ],
    ("GET", "/dashboard/emails"): lambda w: [
        (w.dash.get("/dashboard/emails", params={"tenant": str(w.b.tenant)}), {200}),
        (w.dash.get("/dashboard/emails", params={"recipient": B_RECIPIENT}),
         {200}),
    ],
    ("GET", "/dashboard/emails/{log_id}"): lambda w: [
        (w.dash.get(f"/dashboard/emails/{w.b.email_log}"), {404}),
        # A's row holding B's event and job ids: the ids are A's row's own columns (shown
        # as "not kept"), B's event and job are never joined.
        (w.dash.get(f"/dashboard/emails/{w.a.email_log}"), {200},
         {str(w.b.handled_event), str(w.b.dead_job)}),
    ],
    ("GET", "/dashboard/emails/{log_id}/preview"): lambda w: [
        (w.dash.get(f"/dashboard/emails/{w.b.email_log}/preview"), {404}),
        (w.dash.get(f"/dashboard/emails/{w.a.email_log}/preview"), {200, 404},
         {str(w.b.handled_event), str(w.b.dead_job)}),
    ],
    ("GET", "/dashboard/static/{path}"): lambda w: one(
        w.dash.get("/dashboard/static/dashboard.js"), {200}),
}


def _sign_in_again(w: Walk) -> httpx.Response:
    with httpx.Client(base_url=w.url, timeout=30) as fresh:
        response = fresh.post("/dashboard/login", data={"csrf": login_token(fresh),
                                                         "key": w.a_key, "next": "/"})
        page = fresh.get("/dashboard/")
        assert page.status_code == 200
        assert_clean(w.b, page, "GET /dashboard/ after signing in")
        return response


def _sign_out_elsewhere(w: Walk) -> httpx.Response:
    # A second session of A's, so the walk's own session stays signed in.
    with httpx.Client(base_url=w.url, timeout=30) as other:
        sign_in(other, w.a_key)
        return other.post("/dashboard/logout", data={"csrf": csrf_of(other)})


def assert_clean(b: B, response: httpx.Response, what: str,
                  known: frozenset[str] = frozenset()) -> None:
    """Nothing of B's in the answer, except what A's own request carried (an id or a name
    echoed in "no job <id>" is A's input, not B's data)."""
    sent = str(response.request.url) + response.request.content.decode("utf-8", "replace")
    sent = sent + unquote_plus(sent)
    for secret in b.secrets():
        if secret in sent or secret in known:
            continue
        assert secret not in response.text, f"{what}: tenant B's {secret!r} in the answer"
        assert secret not in response.headers.get("location", ""), (
            f"{what}: tenant B's {secret!r} in the redirect")
