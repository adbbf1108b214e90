"""EmailJob.from_payload: the payload's shape, whatever container the addresses come in."""

from __future__ import annotations

import pytest

from postrelay.core.errors import ValidationError
from postrelay.orchestrator.job import EmailJob


class Name(str):
    """A str subclass: takes the general path, with the same result."""


@pytest.mark.parametrize("to", [["a@example.com", "b@example.com"],
                                ("a@example.com", "b@example.com"),
                                [Name("a@example.com"), "b@example.com"]])
def test_addresses_are_a_tuple_of_strings_from_any_sequence(to: object) -> None:
    job = EmailJob.from_payload({"template": "t", "to": to, "cc": "c@example.com"})
    assert job.to == ("a@example.com", "b@example.com") and job.cc == ("c@example.com",)
    assert job.bcc == () and job.reply_to == ()


@pytest.mark.parametrize("to", [["a@example.com", 1], [None], {"a": 1}, 5, [["x"]]])
def test_anything_else_is_refused_naming_the_field(to: object) -> None:
    with pytest.raises(ValidationError) as caught:
        EmailJob.from_payload({"template": "t", "to": ["ok@example.com"], "bcc": to})
    assert caught.value.field == "bcc"


@pytest.mark.parametrize(("extra", "field"), [
    ({"event_id": "not-a-uuid"}, "event_id"),
    ({"event_id": 42}, "event_id"),
    ({"category": 7}, "category"),
    ({"category": "x" * 101}, "category"),
    ({"category": "news\r\nBcc: v@example.com"}, "category"),
])
def test_an_event_id_or_a_category_of_the_wrong_shape_is_refused_naming_it(
        extra: dict[str, object], field: str) -> None:
    """A payload written by the service-role key or a cron entry: a bad event_id raised
    ValueError or AttributeError, which the worker took for a passing failure (the job
    was retried until dead); a bad category went unchecked until it broke the log row or
    the unsubscribe header. Each is now a ValidationError, which fails the job once."""
    with pytest.raises(ValidationError) as caught:
        EmailJob.from_payload({"template": "t", "to": ["a@example.com"], **extra})
    assert caught.value.field == field
