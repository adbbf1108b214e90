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
