"""The outbox: backlog and relay lag, dead events with their error, and replay (one event,
a time range, the dead events) through relay.admin, as `postrelay outbox` and the API do
it. Anything but one event is counted and confirmed first, as the CLI asks."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from postrelay.core.errors import ValidationError
from postrelay.core.telemetry import event
from postrelay.dashboard.web import (
    CurrentUser,
    Db,
    Form,
    first,
    notice_of,
    optional_time,
    optional_uuid,
    redirect_with_notice,
    render,
    tenant_names,
)
from postrelay.relay import outbox_replay, outbox_replay_count, outbox_status

router = APIRouter()

DEAD_SHOWN = 100


@router.get("/outbox")
def outbox_page(request: Request, user: CurrentUser, engine: Db, notice: str = "",
                sig: str = "") -> HTMLResponse:
    with engine.begin() as conn:
        status = outbox_status(conn, tenant_id=user.tenant_id, dead_limit=DEAD_SHOWN)
        tenants = tenant_names(conn, user)
    return render(request, "outbox.html", {
        "s": status, "tenants": tenants, "flash": notice_of(request, notice, sig)}, user=user)


@router.post("/outbox/replay")
def outbox_replay_form(request: Request, user: CurrentUser, engine: Db,
                       form: Form) -> Response:
    event_id = optional_uuid("eventId", first(form, "event_id"))
    since = optional_time("since", first(form, "since"))
    until = optional_time("until", first(form, "until"))
    dead = first(form, "dead") == "1"
    if event_id is None and since is None and until is None and not dead:
        raise ValidationError("eventId", "give an event id, a time range (since/until) or "
                                         "dead (the events the relay gave up on)")
    if event_id is not None and (since is not None or until is not None or dead):
        raise ValidationError("eventId", "give an event id or a time range, not both")
    if since is not None and until is not None and since >= until:
        raise ValidationError("until", "must be after since")
    if event_id is None and first(form, "confirmed") != "1":
        with engine.begin() as conn:
            count = outbox_replay_count(conn, since=since, until=until,
                                        tenant_id=user.tenant_id, dead=dead)
        if count == 0:  # nothing to confirm
            return redirect_with_notice(request, "/outbox",
                                        "No event matches: nothing was replayed.")
        return render(request, "outbox_confirm.html", {
            "count": count, "since": since, "until": until, "dead": dead,
            "fields": {"since": first(form, "since"), "until": first(form, "until")}},
            user=user)
    with engine.begin() as conn:
        count = outbox_replay(conn, event_id=event_id, since=since, until=until,
                              tenant_id=user.tenant_id, dead=dead)
    # The relay keeps no audit row of a replay: this event is its record, so it names the
    # range as well as the event (as the API's does).
    event("postrelay.dashboard.outbox_replay", replayed=count, actor=user.actor,
          event_id=str(event_id) if event_id else None,
          since=since.isoformat() if since else None,
          until=until.isoformat() if until else None, dead=dead)
    return redirect_with_notice(
        request, "/outbox", f"{count:,} event{'' if count == 1 else 's'} handed back to the "
        "relay; jobs that still exist are not created again.")
