"""The email orchestrator: routes from outbox events to `email_send` jobs, Jinja2
templates rendered when the job runs, SMTP through a pool of reused connections, and
`aa_email_log` as the record of every outcome. Uses the relay's and the queue's public
names only."""

from postrelay.orchestrator.feedback.unsubscribe import UnsubscribeLinks
from postrelay.orchestrator.feedback.verp import ReturnPath
from postrelay.orchestrator.handler import email_registry
from postrelay.orchestrator.job import EMAIL_KIND, EmailJob, enqueue_email
from postrelay.orchestrator.routes import email_route
from postrelay.orchestrator.templates import Rendered, TemplateError, Templates
from postrelay.orchestrator.transport import SmtpConfig, SmtpPool

__all__ = [
    "EMAIL_KIND",
    "EmailJob",
    "Rendered",
    "ReturnPath",
    "SmtpConfig",
    "SmtpPool",
    "TemplateError",
    "Templates",
    "UnsubscribeLinks",
    "email_registry",
    "email_route",
    "enqueue_email",
]
