"""An outbox replay from the dashboard leaves the record the API's does: the relay keeps
no audit row of a replay, so its log event is the record, and it names what was replayed
(the event, or the time range) and by whom."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

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
    done = admin.post("/dashboard/outbox/replay",
                      data={"csrf": token, "since": since, "until": until})
    assert done.status_code == 303
    (fields,) = replays(caplog)
    assert fields["replayed"] == 1 and fields["actor"] == "dashboard:service-role"
    assert fields["event_id"] is None
    assert fields["since"] == since + "+00:00" and fields["until"] == until + "+00:00"
