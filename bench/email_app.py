"""The email benchmark's application: one route, `user.signed_up` → the `welcome` template."""

from postrelay.orchestrator import email_route

email_route("user.signed_up", template="welcome", to="user.email")
