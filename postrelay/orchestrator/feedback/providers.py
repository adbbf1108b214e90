"""The provider webhooks' configuration, built once from settings when the API starts: a
webhook whose setting is absent is None (its endpoint answers 404), a wrong setting is a
ConfigError before anything is served.

    hooks = ProviderWebhooks.from_settings(settings)
    if hooks.sendgrid is not None:
        hooks.sendgrid.verify(body, signature, timestamp)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from postrelay.core.errors import ConfigError
from postrelay.orchestrator.feedback.model import SuppressionPolicy
from postrelay.orchestrator.feedback.postmark import PostmarkAuth
from postrelay.orchestrator.feedback.sendgrid import SendgridVerifier
from postrelay.orchestrator.feedback.sns import SnsVerifier

if TYPE_CHECKING:
    from postrelay.core.settings import Settings

MIN_PASSWORD = 16


@dataclass(frozen=True)
class ProviderWebhooks:
    sns: SnsVerifier | None
    postmark: PostmarkAuth | None
    sendgrid: SendgridVerifier | None
    policy: SuppressionPolicy

    @classmethod
    def from_settings(cls, settings: Settings) -> ProviderWebhooks:
        topics = {t.strip() for t in (settings.feedback_ses_topic_arns or "").split(",")
                  if t.strip()}
        sns = SnsVerifier(topics, tolerance_secs=settings.feedback_ses_tolerance_secs,
                          host_pattern=settings.feedback_ses_cert_hosts,
                          pinned_cert=settings.feedback_ses_cert_file,
                          ca_file=settings.feedback_ses_ca_file) if topics else None
        sendgrid = SendgridVerifier(
            settings.feedback_sendgrid_public_key,
            tolerance_secs=settings.feedback_sendgrid_tolerance_secs,
        ) if settings.feedback_sendgrid_public_key else None
        return cls(sns=sns, postmark=_postmark(settings), sendgrid=sendgrid,
                   policy=SuppressionPolicy.from_settings(settings))


def _postmark(settings: Settings) -> PostmarkAuth | None:
    user = settings.feedback_postmark_username
    password = settings.feedback_postmark_password
    if not user and not password:
        return None
    if not user or not password:
        raise ConfigError("POSTRELAY_FEEDBACK_POSTMARK_USERNAME and _PASSWORD: give both")
    if len(password.get_secret_value()) < MIN_PASSWORD:
        raise ConfigError("POSTRELAY_FEEDBACK_POSTMARK_PASSWORD: at least "
                          f"{MIN_PASSWORD} characters")
    return PostmarkAuth(user, password.get_secret_value())
