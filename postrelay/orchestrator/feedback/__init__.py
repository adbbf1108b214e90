"""Delivery feedback: what arrives after the SMTP handoff (bounces, complaints, delivery
reports, unsubscribes), matched to the email log and recorded with its effects in one
transaction (`record_feedback`)."""

from postrelay.orchestrator.feedback.model import (
    Feedback,
    Recorded,
    SuppressionPolicy,
    bounce_kind,
    suppresses,
)
from postrelay.orchestrator.feedback.record import record_feedback, record_many

__all__ = [
    "Feedback",
    "Recorded",
    "SuppressionPolicy",
    "bounce_kind",
    "record_feedback",
    "record_many",
    "suppresses",
]
