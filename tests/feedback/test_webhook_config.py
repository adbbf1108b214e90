"""The provider webhooks' settings: off until given, and a wrong one stops the API at start
with the variable named (no database needed)."""

from __future__ import annotations

import base64

import pytest
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from postrelay.core.errors import ConfigError
from postrelay.core.settings import Settings
from postrelay.orchestrator import ProviderWebhooks
from postrelay.orchestrator.feedback.sns import SnsVerifier
from postrelay.orchestrator.feedback.webhook import WebhookAuthError

TOPIC = "arn:aws:sns:us-west-2:123456789012:ses-feedback"


def hooks(**settings: object) -> ProviderWebhooks:
    return ProviderWebhooks.from_settings(Settings(**settings))  # type: ignore[arg-type]


def test_every_webhook_is_off_until_its_settings_are_given():
    off = hooks()
    assert (off.sns, off.postmark, off.sendgrid) == (None, None, None)


def test_the_settings_that_turn_each_on():
    key = ec.generate_private_key(ec.SECP256R1()).public_key()
    der = base64.b64encode(key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).decode()
    pem = key.public_bytes(serialization.Encoding.PEM,
                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    on = hooks(feedback_ses_topic_arns=f" {TOPIC} ,", feedback_postmark_username="pm",
               feedback_postmark_password="a-long-webhook-password",
               feedback_sendgrid_public_key=der)
    assert on.sns is not None and on.sns.topics == {TOPIC}
    china, fifo = "arn:aws-cn:sns:cn-north-1:123456789012:f", f"{TOPIC}.fifo"
    assert hooks(feedback_ses_topic_arns=f"{china},{fifo}").sns.topics == {china, fifo}
    assert on.postmark is not None and on.sendgrid is not None
    assert hooks(feedback_sendgrid_public_key=pem).sendgrid is not None


@pytest.mark.parametrize(("settings", "named"), [
    ({"feedback_postmark_username": "pm"}, "POSTMARK_USERNAME and _PASSWORD"),
    ({"feedback_postmark_username": "pm", "feedback_postmark_password": "short"},
     "POSTMARK_PASSWORD"),
    ({"feedback_sendgrid_public_key": "not a key"}, "SENDGRID_PUBLIC_KEY"),
    ({"feedback_sendgrid_public_key": base64.b64encode(b"\x30\x03junk").decode()},
     "SENDGRID_PUBLIC_KEY"),
    # The topic's name, or its URL, where its ARN belongs: no message would ever match.
    ({"feedback_ses_topic_arns": "ses-feedback"}, "TOPIC_ARNS: 'ses-feedback' is not"),
    ({"feedback_ses_topic_arns": f"{TOPIC}, https://sns.us-west-2.amazonaws.com/x"},
     "TOPIC_ARNS: 'https://"),
    ({"feedback_ses_topic_arns": TOPIC, "feedback_ses_cert_hosts": "sns(["}, "CERT_HOSTS"),
    # Set but empty: no host allowed, every message refused once the API ran.
    ({"feedback_ses_topic_arns": TOPIC, "feedback_ses_cert_hosts": ""}, "CERT_HOSTS: empty"),
    ({"feedback_ses_topic_arns": TOPIC, "feedback_ses_cert_hosts": " "}, "CERT_HOSTS: empty"),
    ({"feedback_ses_topic_arns": TOPIC, "feedback_ses_cert_file": "/nonexistent.pem"},
     "CERT_FILE"),
    ({"feedback_ses_topic_arns": TOPIC, "feedback_ses_ca_file": "/nonexistent.pem"},
     "CA_FILE"),
])
def test_a_wrong_setting_is_a_config_error_naming_it(settings, named):
    with pytest.raises(ConfigError, match=named):
        hooks(**settings)


def test_a_pinned_certificate_must_be_an_rsa_certificate(tmp_path):
    ecdsa = trustme.CA().issue_cert("sns.amazonaws.com")  # SNS signs with RSA
    path = tmp_path / "cert.pem"
    path.write_bytes(ecdsa.cert_chain_pems[0].bytes())
    with pytest.raises(ConfigError, match="CERT_FILE: .*not RSA"):
        hooks(feedback_ses_topic_arns=TOPIC, feedback_ses_cert_file=str(path))
    path.write_text("not a certificate")
    with pytest.raises(ConfigError, match="CERT_FILE: .*not a PEM certificate"):
        hooks(feedback_ses_topic_arns=TOPIC, feedback_ses_cert_file=str(path))


def _sns() -> SnsVerifier:
    settings = Settings(feedback_ses_topic_arns=TOPIC)
    return SnsVerifier({TOPIC}, tolerance_secs=settings.feedback_ses_tolerance_secs,
                       host_pattern=settings.feedback_ses_cert_hosts)


@pytest.mark.parametrize("host", [
    "sns.s3.amazonaws.com", "sns.s3-accelerate.amazonaws.com", "sns.s3-us-west-2.amazonaws.com",
    "sns.execute-api.amazonaws.com", "sns.us-east-1.amazonaws.com.evil.example"])
def test_the_default_certificate_hosts_are_sns_regions_alone(host):
    """`sns\\.[a-z0-9-]+\\.amazonaws\\.com` took `sns.s3.amazonaws.com`: the storage bucket
    named sns, whose owner could serve a certificate of their own and sign complaints."""
    with pytest.raises(WebhookAuthError, match="not an https URL on an allowed host"):
        _sns()._fetched(f"https://{host}/SimpleNotificationService-0000.pem")


@pytest.mark.parametrize("host", [
    "sns.us-east-1.amazonaws.com", "sns.ap-southeast-2.amazonaws.com",
    "sns.cn-north-1.amazonaws.com.cn", "sns.us-gov-west-1.amazonaws.com",
    "sns.us-isob-east-1.amazonaws.com"])
def test_every_sns_region_is_a_certificate_host(host):
    _sns()._allowed(f"https://{host}/SimpleNotificationService-0000.pem", "SigningCertURL")


def test_a_signing_certificate_comes_from_a_pem_path():
    with pytest.raises(WebhookAuthError, match="not a .pem"):
        _sns()._fetched("https://sns.us-east-1.amazonaws.com/cert?x=.pem")
