"""The sender identity the settings give every message, checked as a worker starts: a
From or Message-ID domain no message can carry would otherwise fail each email job that
uses it, one by one, long after the worker said it had started."""

from __future__ import annotations

from uuid import UUID

from postrelay.core.errors import ConfigError, ValidationError
from postrelay.core.settings import Settings
from postrelay.orchestrator.addresses import parse_address
from postrelay.orchestrator.message import message_id_for


def check_identity_settings(settings: Settings) -> None:
    """ConfigError naming POSTRELAY_EMAIL_FROM or POSTRELAY_EMAIL_MESSAGE_ID_DOMAIN, and the
    rule, when a message could not be sent with it. Unset or empty: nothing to check (the
    From then comes from each route, the domain from the From)."""
    try:
        if settings.email_from:  # the sender takes any non-empty value, blank included
            parse_address(settings.email_from, field="POSTRELAY_EMAIL_FROM")
        domain = settings.email_message_id_domain
        if domain and domain.strip():  # blank: the From's domain, as message_id_domain()
            try:
                message_id_for(UUID(int=0), domain.strip())
            except ValidationError as exc:
                raise ValidationError("POSTRELAY_EMAIL_MESSAGE_ID_DOMAIN", exc.rule) from None
    except ValidationError as exc:
        raise ConfigError(f"{exc.field}: {exc.rule}") from None
