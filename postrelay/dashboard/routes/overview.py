"""The overview: one page whose panels refresh every few seconds (static/dashboard.js
fetches the `/panels` fragment and swaps it in; no reload)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import Engine

from postrelay.dashboard import chart, queries
from postrelay.dashboard.web import CurrentUser, Db, User, render, tenant_names
from postrelay.orchestrator import feedback_rates

router = APIRouter()

REFRESH_SECS = 5
TOP_TENANTS = 12
# Where providers start to act: a bounce rate past 5% or a complaint rate past 0.1%.
BOUNCE_WARN, COMPLAINT_WARN = 0.05, 0.001


@router.get("/")
def overview_page(request: Request, user: CurrentUser, engine: Db) -> HTMLResponse:
    # The rates read a week of the email log: on the page, not in the panels that refresh
    # every few seconds (they move slowly anyway).
    with engine.begin() as conn:
        rates = feedback_rates(conn, tenant_id=user.tenant_id)
    return render(request, "overview.html", {
        **_panels(user, engine), "refresh_secs": REFRESH_SECS, "rates": rates,
        "bounce_warn": BOUNCE_WARN, "complaint_warn": COMPLAINT_WARN}, user=user)


@router.get("/panels")
def overview_panels(request: Request, user: CurrentUser, engine: Db) -> HTMLResponse:
    return render(request, "_panels.html", _panels(user, engine), user=user)


def _panels(user: User, engine: Engine) -> dict[str, Any]:
    with engine.begin() as conn:
        data = queries.overview(conn, user.tenant_id)
        tenants = tenant_names(conn, user)
    by_tenant = sorted(data.counts.by_tenant.items(), key=lambda kv: _busy(kv[1]), reverse=True)
    return {
        "o": data,
        "chart": chart.per_minute(data.minutes),
        "tenants": tenants,
        "top_tenants": by_tenant[:TOP_TENANTS],
        "more_tenants": max(len(by_tenant) - TOP_TENANTS, 0),
        "kinds": sorted(data.counts.by_kind.items()),
        "email_total": sum(data.emails.values()),
    }


def _busy(counts: Mapping[str, int]) -> tuple[int, int]:
    """Tenants with work waiting or dead first, then by size."""
    return (counts.get("pending", 0) + counts.get("running", 0) + counts.get("dlq", 0),
            sum(counts.values()))
