"""The overview: one page whose panels refresh every few seconds (static/dashboard.js
fetches the `/panels` fragment and swaps it in; no reload)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import Engine

from postrelay.dashboard import chart, queries
from postrelay.dashboard.web import CurrentUser, Db, User, render, tenant_names

router = APIRouter()

REFRESH_SECS = 5
TOP_TENANTS = 12


@router.get("/")
def overview_page(request: Request, user: CurrentUser, engine: Db) -> HTMLResponse:
    return render(request, "overview.html", {**_panels(user, engine),
                                             "refresh_secs": REFRESH_SECS}, user=user)


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


def _busy(counts: dict[str, int]) -> tuple[int, int]:
    """Tenants with work waiting or dead first, then by size."""
    return (counts.get("pending", 0) + counts.get("running", 0) + counts.get("dlq", 0),
            sum(counts.values()))
