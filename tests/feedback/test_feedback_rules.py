"""The rules a report carries before anything is recorded: what it may say, which kinds and
codes suppress, how a bounce's code makes it hard or soft, and what makes two reports one."""

from __future__ import annotations

import pytest

from postrelay.core.errors import ValidationError
from postrelay.orchestrator.feedback import Feedback, bounce_kind, suppresses


def test_bad_feedback_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="kind"):
        Feedback(kind="exploded", source="mail")
    with pytest.raises(ValidationError, match="source"):
        Feedback(kind="bounced", source="carrier-pigeon")
    with pytest.raises(ValidationError, match="status"):
        Feedback(kind="bounced", source="mail", status="550")
    with pytest.raises(ValidationError, match="vouched"):
        Feedback(kind="unsubscribe", source="one-click", vouched=True)


@pytest.mark.parametrize(("kind", "status", "expected"), [
    ("bounced", "5.1.1", True), ("bounced", "5.1.10", True), ("bounced", "5.2.1", True),
    ("bounced", "5.4.4", True), ("bounced", None, True), ("bounced", "5.7.1", False),
    ("bounced", "5.7.26", False), ("bounced", "5.3.4", False), ("complaint", None, True),
    ("unsubscribe", None, True), ("soft-bounced", "4.2.2", False), ("delivered", None, False),
    ("auto-reply", None, False), ("delayed", "4.4.1", False),
    # Microsoft 365's per-hour receive limits: codes of their own, not 5.2.1 (disabled).
    ("bounced", "5.2.121", False), ("bounced", "5.2.122", False),
])
def test_which_feedback_suppresses(kind, status, expected):
    assert suppresses(kind, status) is expected


def test_bounce_kinds_by_status():
    assert [bounce_kind(s) for s in ("5.1.1", "4.4.7", "5.2.2", None, "5.7.1")] == [
        "bounced", "soft-bounced", "soft-bounced", "bounced", "bounced"]


def test_a_dedupe_key_depends_on_the_report_not_on_its_spelling():
    one = Feedback(kind="bounced", source="mail", recipient=" Ann@Example.com ",
                   message_id="abc@x", source_event_id="e")
    two = Feedback(kind="bounced", source="mail", recipient="ann@example.com",
                   message_id="<abc@x>", source_event_id="e")
    three = Feedback(kind="bounced", source="mail", recipient="ann@example.com",
                     message_id="<abc@x>", source_event_id="f")
    assert one.dedupe_key() == two.dedupe_key() != three.dedupe_key()
