"""A tiny application for relay processes in email tests (templates in mail_templates/)."""

from pathlib import Path

from postrelay.orchestrator import email_route

TEMPLATES = Path(__file__).parent / "mail_templates"

email_route("user.signed_up", template="welcome", to="user.email")
# Invoices must not go out twice: their template holds an unknown outcome for an operator.
email_route("invoice.issued", template="invoice", to="customer.email")
