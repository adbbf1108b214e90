"""An outbox replay from the dashboard leaves the record the API's does: the relay keeps
no audit row of a replay, so its log event is the record, and it names what was replayed
(the event, or the time range) and by whom."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from tests.dashboard.conftest import csrf_of, insert_event


def replays(caplog) -> list[dict]:
    return [r.fields for r in caplog.records
            if getattr(r, "event", None) == "postrelay.dashboard.outbox_replay"]


def test_a_range_replay_is_logged_with_its_range_and_actor(admin, engine, tenant, caplog):
    caplog.set_level(logging.INFO, logger="postrelay")
    with engine.begin() as conn:
        insert_event(conn, tenant, handled_at=datetime.now(UTC),
                     created_at=datetime.now(UTC) - timedelta(hours=1))
    token = csrf_of(admin, "/dashboard/outbox")
    since = (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S")
    until = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    asked = admin.post("/dashboard/outbox/replay",
                       data={"csrf": token, "since": since, "until": until})
    assert asked.status_code == 200 and "Replay 1 event?" in asked.text
    assert replays(caplog) == []  # nothing replayed before the confirmation
    done = admin.post("/dashboard/outbox/replay", data=confirmation(asked.text))
    assert done.status_code == 303
    (fields,) = replays(caplog)
    assert fields["replayed"] == 1 and fields["actor"] == "dashboard:service-role"
    assert fields["event_id"] is None and fields["dead"] is False
    assert fields["since"] == since + "+00:00" and fields["until"] == until + "+00:00"


def confirmation(page: str) -> dict[str, str]:
    """The fields the confirmation page's form posts."""
    form = page[page.index('class="actions"'):]
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">',
                           form[:form.index("</form>")]))


def test_the_dead_events_alone_are_replayed_after_a_confirmation(admin, engine, tenant,
                                                                 other_tenant, caplog):
    """As `outbox replay --dead` does: the events the relay gave up on (every tenant's, for
    the service role), and no others."""
    caplog.set_level(logging.INFO, logger="postrelay")
    with engine.begin() as conn:
        dead = insert_event(conn, tenant, attempts=10, dead_at=datetime.now(UTC))
        handled = insert_event(conn, tenant, handled_at=datetime.now(UTC))
        insert_event(conn, other_tenant, attempts=10, dead_at=datetime.now(UTC))
    token = csrf_of(admin, "/dashboard/outbox")
    asked = admin.post("/dashboard/outbox/replay", data={"csrf": token, "dead": "1"})
    assert asked.status_code == 200 and "Replay 2 events?" in asked.text
    assert "The dead events" in asked.text
    done = admin.post("/dashboard/outbox/replay", data=confirmation(asked.text))
    assert done.status_code == 303
    assert "2 events handed back" in admin.get(done.headers["location"]).text
    (fields,) = replays(caplog)
    assert fields["replayed"] == 2 and fields["dead"] is True
    with engine.connect() as conn:
        states = dict(conn.execute(text(
            "SELECT id, dead_at IS NULL AND handled_at IS NULL FROM mdm.aa_outbox_event "
            "WHERE id IN (:a, :b)"), {"a": dead, "b": handled}).all())
    assert states == {dead: True, handled: False}  # the handled one was left alone
    # Nothing left to replay: said so, nothing asked.
    again = admin.post("/dashboard/outbox/replay", data={"csrf": token, "dead": "1",
                                                         "until": "2000-01-01T00:00"})
    assert again.status_code == 303
    assert "No event matches" in admin.get(again.headers["location"]).text


def test_one_event_with_dead_is_refused(admin, engine, tenant):
    with engine.begin() as conn:
        dead = insert_event(conn, tenant, attempts=10, dead_at=datetime.now(UTC))
    token = csrf_of(admin, "/dashboard/outbox")
    refused = admin.post("/dashboard/outbox/replay",
                         data={"csrf": token, "event_id": str(dead), "dead": "1"})
    assert refused.status_code == 400 and "not both" in refused.text
