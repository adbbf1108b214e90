"""enqueue_email takes an EmailJob as domain code writes one: an address field may be one
address as a string (parse_addresses and a payload read it so), a context any mapping;
anything else is a ValidationError naming the field, and the caller's transaction stays
usable."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from postrelay.core.errors import ValidationError
from postrelay.orchestrator import EmailJob, enqueue_email, enqueue_email_async
from tests.factories import job_row


def written(**fields: Any) -> Any:
    """An EmailJob to ann@example.com, with `fields` as given, whatever their type."""
    return EmailJob(**{"template": "welcome", "to": ("ann@example.com",), **fields})


def test_one_address_as_a_string_is_one_recipient(engine, tenant):
    # A string was read letter by letter: "to[0]: 'a' is not a valid email address".
    message = written(
        to="ann@example.com",
        cc="bob@example.com",
        bcc=["eve@example.com"],
        reply_to="desk@example.com",
        context=None,
    )
    with engine.begin() as conn:
        job_id = enqueue_email(conn, message, tenant_id=tenant)
    with engine.connect() as conn:
        payload = job_row(conn, job_id)["payload"]
    assert (payload["to"], payload["cc"], payload["bcc"], payload["reply_to"]) == (
        ["ann@example.com"],
        ["bob@example.com"],
        ["eve@example.com"],
        ["desk@example.com"],
    )
    assert payload["context"] == {}


@pytest.mark.parametrize(
    ("message", "field", "rule"),
    [
        # Each was a TypeError or an AttributeError that named no field.
        ({"template": "welcome", "to": ["ann@example.com"]}, "message", "must be an EmailJob"),
        (written(context=[("a", 1)]), "context", "must be a JSON object"),
        (written(sender=["shop@example.com"]), "from", "must be a string"),
        (written(to=42), "to", "an address or a list of addresses"),
    ],
)
async def test_a_message_of_the_wrong_shape_is_refused_naming_the_field(
    engine, async_engine, tenant, message: Any, field: str, rule: str
):
    with engine.begin() as conn:
        with pytest.raises(ValidationError) as info:
            enqueue_email(conn, message, tenant_id=tenant)
        assert (info.value.field, rule in info.value.rule) == (field, True), info.value
        assert conn.execute(text("SELECT count(*) FROM mdm.aa_job")).scalar_one() == 0
    async with async_engine.begin() as conn:
        with pytest.raises(ValidationError) as info:
            await enqueue_email_async(conn, message, tenant_id=tenant)
        assert info.value.field == field
        assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
