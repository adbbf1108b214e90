"""The email orchestrator: routes from outbox events to `email_send` jobs, Jinja2
templates rendered when the job runs, SMTP through a pool of reused connections, and
`aa_email_log` as the record of every outcome. Uses the relay's and the queue's public
names only."""

# Exported on purpose for the packages above: the operator's functions (CLI, dashboard),
# addresses and messages for `postrelay email`.
from postrelay.orchestrator.addresses import parse_address
from postrelay.orchestrator.admin import (
    categories_text,
    email_list,
    email_story,
    suppression_list,
    suppression_remove,
)
from postrelay.orchestrator.cancel import cancel_job, cancel_jobs
from postrelay.orchestrator.contexts import event_context
from postrelay.orchestrator.email_hours import EmailHourTally
from postrelay.orchestrator.feedback import Feedback, Recorded, SuppressionPolicy, record_feedback
from postrelay.orchestrator.feedback.admin import feedback_list, suppression_audit
from postrelay.orchestrator.feedback.inbound import InboundConfig, InboundServer
from postrelay.orchestrator.feedback.ingest import ingest, mark_seen, messages
from postrelay.orchestrator.feedback.postmark import postmark_reports
from postrelay.orchestrator.feedback.providers import ProviderWebhooks
from postrelay.orchestrator.feedback.sendgrid import (
    SIGNATURE_HEADER as SENDGRID_SIGNATURE_HEADER,
)
from postrelay.orchestrator.feedback.sendgrid import (
    TIMESTAMP_HEADER as SENDGRID_TIMESTAMP_HEADER,
)
from postrelay.orchestrator.feedback.sendgrid import sendgrid_reports
from postrelay.orchestrator.feedback.ses import ses_reports
from postrelay.orchestrator.feedback.stats import feedback_counts, feedback_rates, inbox_backlog
from postrelay.orchestrator.feedback.unsubscribe import UnsubscribeLinks, UnsubscribeTokenError
from postrelay.orchestrator.feedback.verp import ReturnPath
from postrelay.orchestrator.feedback.webhook import (
    WebhookAuthError,
    WebhookUnavailableError,
    record_batch,
    summary,
)
from postrelay.orchestrator.handler import email_registry
from postrelay.orchestrator.identity import check_identity_settings
from postrelay.orchestrator.job import (
    EMAIL_KIND,
    EmailJob,
    check_email_payload,
    check_job_payload,
    enqueue_email,
    enqueue_email_async,
)
from postrelay.orchestrator.message import build_message, message_id_domain, message_id_for
from postrelay.orchestrator.retention import (
    EMAIL_FEEDBACK_TARGET,
    EMAIL_LOG_TARGET,
    email_feedback_delete_batch,
    email_log_delete_batch,
    email_suppression_audit_delete_batch,
    feedback_retention_days,
    suppression_audit_delete_batch,
)
from postrelay.orchestrator.routes import email_route
from postrelay.orchestrator.templates import Rendered, TemplateError, Templates
from postrelay.orchestrator.transport import SmtpConfig, SmtpPool

__all__ = [
    "EMAIL_FEEDBACK_TARGET",
    "EMAIL_KIND",
    "EMAIL_LOG_TARGET",
    "EmailHourTally",
    "build_message",
    "cancel_job",
    "cancel_jobs",
    "check_email_payload",
    "check_job_payload",
    "categories_text",
    "check_identity_settings",
    "email_feedback_delete_batch",
    "email_list",
    "email_log_delete_batch",
    "email_suppression_audit_delete_batch",
    "email_registry",
    "email_route",
    "email_story",
    "enqueue_email",
    "enqueue_email_async",
    "event_context",
    "feedback_counts",
    "feedback_list",
    "feedback_rates",
    "feedback_retention_days",
    "inbox_backlog",
    "ingest",
    "mark_seen",
    "message_id_domain",
    "message_id_for",
    "messages",
    "parse_address",
    "postmark_reports",
    "record_batch",
    "record_feedback",
    "sendgrid_reports",
    "ses_reports",
    "suppression_audit",
    "suppression_audit_delete_batch",
    "suppression_list",
    "suppression_remove",
    "summary",
    "SENDGRID_SIGNATURE_HEADER",
    "SENDGRID_TIMESTAMP_HEADER",
    "EmailJob",
    "Feedback",
    "InboundConfig",
    "InboundServer",
    "ProviderWebhooks",
    "Received",
    "Recorded",
    "Rendered",
    "ReturnPath",
    "SmtpConfig",
    "SmtpPool",
    "SuppressionPolicy",
    "TemplateError",
    "Templates",
    "UnsubscribeLinks",
    "UnsubscribeTokenError",
    "WebhookAuthError",
    "WebhookUnavailableError",
]
