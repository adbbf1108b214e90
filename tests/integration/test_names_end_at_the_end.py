"""A name, key or code is checked to its last character. In Python's patterns `$` also
matches before a final line break, so `^nightly$` took "nightly\n": stored with the
break, such a name matched nothing later (a payload key, an event type) or showed as two
lines (an API key's name in every audit row)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from postrelay.access import api_key_create
from postrelay.core.errors import ValidationError
from postrelay.core.migrate import write_kind_migration
from postrelay.orchestrator.feedback.model import Feedback
from postrelay.queue import cron_create, limit_set
from postrelay.relay import webhook_add

TABLES = ("aa_api_key", "aa_cron_entry", "aa_job_limit", "aa_webhook_endpoint")


@pytest.mark.parametrize("call, field", [
    (lambda conn, t: api_key_create(conn, "ci\n", tenant_id=t, actor="test:ops"), "name"),
    (lambda conn, t: cron_create(conn, "nightly\n", "0 3 * * *", "reindex", {},
                                 tenant_id=t), "name"),
    (lambda conn, t: limit_set(conn, actor="test:ops", kind="reindex", concurrency=2,
                               key="recipient.domain\n"), "key"),
    (lambda conn, t: webhook_add(conn, t, "https://hooks.example.com/in",
                                 event_types=["order.created\n"]), "event_types"),
])
def test_a_final_line_break_is_refused_and_nothing_is_written(engine, tenant, call, field):
    before = _counts(engine)
    with engine.begin() as conn, pytest.raises(ValidationError) as info:
        call(conn, tenant)
    assert info.value.field == field
    assert _counts(engine) == before


def _counts(engine) -> list[int]:
    with engine.connect() as conn:
        return [conn.execute(text(f"SELECT count(*) FROM mdm.{table}")).scalar_one()
                for table in TABLES]


def test_a_status_code_or_a_kind_name_ends_where_it_ends(tmp_path):
    with pytest.raises(ValidationError) as info:
        Feedback(kind="bounced", source="sendgrid", recipient="ann@example.com",
                 status="5.1.1\n")
    assert info.value.field == "status"
    with pytest.raises(ValueError, match="kind name"):
        write_kind_migration("reindex\n", tmp_path)
    assert list(tmp_path.iterdir()) == []
