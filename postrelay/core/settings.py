"""Service settings: one pydantic-settings object, built once at the edge and passed down.

Every field reads from the environment with the `POSTRELAY_` prefix, e.g.
`POSTRELAY_JOB_RETRY_DELAY_SECS=10`.
"""

import functools
import ipaddress
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal
from uuid import UUID

import platformdirs
import pydantic
from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from postrelay.core.errors import ConfigError, ValidationError
from postrelay.core.limits import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_MAX_PAYLOAD_BYTES,
    MIN_MAX_PAYLOAD_BYTES,
)
from postrelay.core.rates import parse_rate

ENV_PREFIX = "POSTRELAY_"
_UNPARSED_FIELD = re.compile(r'field "(\w+)"')
_JSON_EXAMPLES = {"tenant_weights": '{"<tenant id>": 3}'}
POSTGRES_DRIVERS = ("postgres", "postgresql", "postgresql+psycopg", "postgresql+psycopg2")
# Fields whose value never appears in a repr, a log line or an error message.
SECRET_FIELDS = ("database_url", "migrate_database_url", "smtp_password", "service_role_key",
                 "feedback_secret", "feedback_secret_previous")


def _default_embedded_dir() -> Path:
    return Path(platformdirs.user_data_dir("postrelay")) / "pgdata"


# The longest time a setting may give: beyond it a value is a typo, not a setting, and
# PostgreSQL's intervals and timestamps overflow (at run time, in every maintenance round)
# long before a float does. Infinity and NaN are refused for every setting alike.
MAX_DAYS = 100 * 365
MAX_SECS = MAX_DAYS * 86_400


# Bounds that the configs built in code (queue/workerconfig.py, relay/service.py) share.
MAX_WORKER_CONCURRENCY = 10_000
MAX_RELAY_BATCH_SIZE = 10_000
MAX_RELAY_CONCURRENCY = 32
MAX_RELAY_ATTEMPTS = 1_000_000
MAX_RELAY_JOBS_PER_EVENT = 1_000_000
MAX_RELAY_BYTES_PER_EVENT = 1 << 30


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True,
                                      allow_inf_nan=False)

    # None means: start the embedded PostgreSQL (pgserver) in `embedded_data_dir`. A plain
    # string for the code that connects; repr() and str() show it with the password masked.
    database_url: str | None = None
    embedded_data_dir: Path = Field(default_factory=_default_embedded_dir)

    job_retry_delay_secs: float = Field(default=5.0, ge=0, le=MAX_SECS)
    job_max_retries: int = Field(default=8, ge=1, le=1_000_000)
    job_backoff: Literal["fixed", "exponential"] = "fixed"
    job_backoff_max_secs: float = Field(default=3600.0, gt=0, le=MAX_SECS)
    job_lease_secs: float = Field(default=450.0, gt=0, le=MAX_SECS)
    job_retention_days: float = Field(default=14.0, gt=0, le=MAX_DAYS)
    # The email log and the audits (jobs, cron, pauses and limits, lifted suppressions): kept
    # unless a window is set (docs/operations.md).
    email_log_retention_days: float | None = Field(default=None, gt=0, le=MAX_DAYS)
    audit_retention_days: float | None = Field(default=None, gt=0, le=MAX_DAYS)
    job_timeout_secs: float | None = Field(default=None, gt=0, le=MAX_SECS)

    worker_concurrency: int = Field(default=10, ge=1, le=MAX_WORKER_CONCURRENCY)
    worker_grace_secs: float = Field(default=30.0, ge=0, le=MAX_SECS)
    worker_poll_interval_secs: float = Field(default=1.0, gt=0, le=MAX_SECS)
    # A worker with short jobs claims ahead of its free slots what it would start within
    # this long (queue/worker.py); 0: claim only for free slots.
    worker_claim_ahead_secs: float = Field(default=0.03, ge=0, le=10)
    # Fair claiming: within a priority level, each claim is shared out across the tenants
    # with due work, by weight (a tenant not named in tenant_weights weighs 1, e.g.
    # POSTRELAY_TENANT_WEIGHTS='{"<tenant id>": 3}'). Off: strictly by priority, then due
    # time, as one queue.
    fair_claiming: bool = True
    tenant_weights: dict[UUID, Annotated[int, Field(ge=1, le=1000)]] = Field(default_factory=dict)
    # Prometheus metrics of each worker process on http://HOST:PORT/metrics; unset: off.
    worker_metrics_port: int | None = Field(default=None, ge=1, le=65535)
    worker_metrics_host: str = "127.0.0.1"
    # The API's /metrics exports per-tenant email rates for this many tenants at most, the
    # largest senders first: a label per tenant must not grow without a bound.
    metrics_max_tenants: int = Field(default=500, ge=0, le=100_000)
    # How often maintenance (the stale-claim rescuer) runs; never less often than a quarter of
    # the job lease (see queue/maintenance/leader.py), so a rescue follows the lease closely.
    maintenance_interval_secs: float = Field(default=5.0, gt=0, le=MAX_SECS)
    # How often each worker's cron scheduler looks for due slots (schedules have seconds).
    cron_interval_secs: float = Field(default=1.0, gt=0, le=MAX_SECS)

    outbox_retention_days: float = Field(default=7.0, gt=0, le=MAX_DAYS)
    relay_batch_size: int = Field(default=500, ge=1, le=MAX_RELAY_BATCH_SIZE)
    # Batches in flight at once while there is a backlog.
    relay_concurrency: int = Field(default=3, ge=1, le=MAX_RELAY_CONCURRENCY)
    # Failed routing attempts before an outbox event is parked as dead. Bounded as job
    # attempts are: the relay compares it as a PostgreSQL integer, and past that range the
    # failure of an event could not be recorded at all (integer out of range).
    relay_max_attempts: int = Field(default=10, ge=1, le=MAX_RELAY_ATTEMPTS)
    # Jobs, and bytes of job payload, one event's routes may ask for: past either the event
    # fails alone, no job made, rather than an unbounded fan-out (a route that copies the
    # payload into every job) filling the relay's memory and one transaction.
    relay_max_jobs_per_event: int = Field(default=10_000, ge=1, le=MAX_RELAY_JOBS_PER_EVENT)
    relay_max_bytes_per_event: int = Field(default=64 << 20, ge=1 << 20,
                                           le=MAX_RELAY_BYTES_PER_EVENT)

    # LISTEN/NOTIFY wake-ups; off whenever `pooler` is "transaction".
    notify: bool = True
    # Delivery attempts (mdm.aa_webhook_attempt) are kept this long.
    webhook_attempt_retention_days: float = Field(default=30.0, gt=0, le=MAX_DAYS)
    # "transaction": the database URL points at a pooler in transaction mode (PgBouncer's
    # pool_mode = transaction). Then no connection sends startup options or prepares
    # statements on the server, nothing sets session state, and nothing LISTENs.
    pooler: Literal["none", "transaction"] = "none"
    # Where `postrelay migrate` connects when set: a direct connection past the pooler.
    migrate_database_url: str | None = None
    # Webhooks to loopback, private and link-local addresses are refused unless this is set.
    webhook_allow_private: bool = False

    # Email: templates, sender identity and the SMTP server (see README "Email").
    email_templates_dir: Path = Path("templates")
    email_from: str | None = None  # the From of routes that do not name one
    # Right-hand side of the deterministic Message-ID; default: the From address's domain.
    email_message_id_domain: str | None = None
    smtp_host: str = "localhost"
    smtp_port: int = Field(default=25, ge=1, le=65535)
    # none: plain SMTP; starttls: upgrade after EHLO (required); tls: implicit TLS (port 465).
    smtp_security: Literal["none", "starttls", "tls"] = "none"
    smtp_username: str | None = None
    smtp_password: SecretStr | None = None
    smtp_timeout_secs: float = Field(default=30.0, gt=0, le=MAX_SECS)
    smtp_pool_size: int = Field(default=10, ge=1, le=1000)  # reused connections per worker
    smtp_validate_certs: bool = True
    smtp_ca_file: Path | None = None  # trust this CA bundle (a private relay's certificate)
    # After a 421/454 the sender waits this long, and every worker pauses email_send as long
    # (queue/throttles.py); after a 535 it stops sending for
    # smtp_auth_pause_secs instead of failing every job against bad credentials.
    smtp_throttle_secs: float = Field(default=5.0, ge=0, le=MAX_SECS)
    smtp_auth_pause_secs: float = Field(default=60.0, ge=0, le=MAX_SECS)
    # BDAT (RFC 3030) where the server offers CHUNKING: the message in the same write as
    # MAIL and RCPT, one round trip. Off for a relay whose CHUNKING is known to misbehave.
    smtp_chunking: bool = True
    # The most email_send jobs claimed per second across every worker ("14/s", "1000/min"):
    # workers set the kind-wide email_send limit's rate to it as they start (queue/limits.py).
    smtp_rate: str | None = None
    # A destination that refused work (SMTP 421/454, webhook 429/503) is throttled for every
    # worker; after its pause its rate doubles every this many seconds until it is back to
    # its configured limit (or unlimited) (queue/throttles.py).
    throttle_step_secs: float = Field(default=10.0, gt=0, le=3600)
    # Delivery feedback (README "Delivery feedback"). With a bounce domain, each message's
    # envelope sender is a signed VERP address on it (the From header is unchanged), and
    # the feedback secret signs it: required then, at least 16 characters.
    email_bounce_domain: str | None = None
    feedback_secret: SecretStr | None = None
    # The secret before this one, kept while mail it signed may still bounce or be
    # unsubscribed from: its tokens are still taken, new ones are signed with the secret
    # above alone.
    feedback_secret_previous: SecretStr | None = None
    # Where `postrelay api` is reached from outside: the one-click unsubscribe links of
    # templates with `unsubscribe = true` point at PUBLIC_URL/u/<token> (https, or http for
    # a loopback host). Needs the feedback secret too.
    public_url: str | None = None
    # `postrelay inbound`: the SMTP receiver for the bounce domain. STARTTLS is offered
    # when a certificate and key are given.
    inbound_host: str = "0.0.0.0"
    inbound_port: int = Field(default=25, ge=1, le=65535)
    # A message is held in memory and stored as one bytea value, which PostgreSQL caps at
    # 1 GB: a larger cap could never be met.
    inbound_max_bytes: int = Field(default=5 * 1024 * 1024, ge=1024, le=512 * 1024 * 1024)
    inbound_max_connections: int = Field(default=50, ge=1, le=10_000)
    inbound_tls_cert: Path | None = None
    inbound_tls_key: Path | None = None
    # Soft bounces suppress an address once
    # this many arrived within the window; hard bounces and complaints at once.
    email_soft_bounce_limit: int = Field(default=3, ge=1, le=1000)
    email_soft_bounce_window_days: float = Field(default=7.0, gt=0, le=MAX_DAYS)
    # Delivery feedback rows (bounces, complaints) are kept this long; unset: as long as the
    # email log they name (POSTRELAY_EMAIL_LOG_RETENTION_DAYS), never less than the window
    # above, over which soft bounces are counted (orchestrator/retention.py).
    email_feedback_retention_days: float | None = Field(default=None, gt=0, le=MAX_DAYS)
    # Provider webhooks of `postrelay api` (docs/operations.md "Provider webhooks"); each
    # answers 404 until its setting is given. SES through SNS: the topics whose
    # notifications are taken (comma-separated ARNs: a valid SNS signature only proves SNS
    # sent it, from anybody's topic), where the signing certificate may be fetched from
    # (a host pattern, over HTTPS) or a certificate pinned from a file, and a CA bundle
    # for that HTTPS fetch.
    feedback_ses_topic_arns: str | None = None
    feedback_ses_cert_hosts: str = \
        r"sns\.[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d{1,2}\.amazonaws\.com(\.cn)?"
    feedback_ses_cert_file: Path | None = None
    feedback_ses_ca_file: Path | None = None
    # An SNS message whose signed Timestamp (when SNS took it) is further than this from the
    # API host's clock, either way, is refused as a replay. SNS resends a message as it was
    # signed, and an HTTP/S delivery policy retries for at most 3600 s (a hard limit;
    # the default policy 3 times, 20 s apart): twice that leaves an hour for jitter, slow
    # deliveries and a host clock that is off.
    feedback_ses_tolerance_secs: float = Field(default=7200.0, gt=0, le=86_400)
    # Postmark: the user name and password of the webhook URL's basic authentication.
    feedback_postmark_username: str | None = None
    feedback_postmark_password: SecretStr | None = None
    # SendGrid: the Event Webhook's verification key (base64 DER, as SendGrid shows it,
    # or PEM).
    feedback_sendgrid_public_key: str | None = None
    # A batch whose signed timestamp header is further than this from the API host's clock,
    # either way, is refused as a replay. SendGrid retries a delivery for up to 24 hours and
    # does not say whether a retry is signed anew: a day and an hour refuses none of them
    # (a replay inside it records nothing new: each event is recorded once, by its id).
    feedback_sendgrid_tolerance_secs: float = Field(default=90_000.0, gt=0, le=604_800)

    # The largest JSON document (payload, headers) a write accepts, and with some room the
    # largest request body the HTTP API reads (core/limits.py).
    max_payload_bytes: int = Field(default=DEFAULT_MAX_PAYLOAD_BYTES, ge=MIN_MAX_PAYLOAD_BYTES,
                                   le=MAX_MAX_PAYLOAD_BYTES)

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"

    # The HTTP API's service-role key (`apikey` header or `Authorization: Bearer`). Without
    # one, `postrelay api` refuses to start rather than serve the queue unauthenticated; a
    # key shorter than 32 characters is refused too (postrelay/access/keys.py).
    service_role_key: SecretStr | None = None
    # Failed authentication (a wrong key to the API or the dashboard's sign-in), per API
    # process: at most this many per client address and in all, in a sliding window; then
    # 429 with Retry-After (postrelay/access/throttle.py).
    auth_failures_per_client: int = Field(default=10, ge=1, le=1_000_000)
    auth_failures_total: int = Field(default=100, ge=1, le=10_000_000)
    auth_failure_window_secs: float = Field(default=60.0, gt=0, le=86_400)
    # The reverse proxies (comma-separated addresses, or *) whose X-Forwarded-For gives the
    # client address `postrelay api` sees; unset: the peer address, proxy headers ignored.
    api_forwarded_allow_ips: str | None = None


    @property
    def listens(self) -> bool:
        """Whether workers and relays LISTEN for wake-ups: not behind a transaction pooler,
        which hands each transaction to any server connection."""
        return self.notify and self.pooler == "none"

    @field_validator("email_feedback_retention_days")
    @classmethod
    def _feedback_outlives_the_soft_bounce_window(cls, value: float | None,
                                                  info: ValidationInfo) -> float | None:
        window = info.data.get("email_soft_bounce_window_days")
        if value is not None and window is not None and value < window:
            raise ValueError(f"must be at least POSTRELAY_EMAIL_SOFT_BOUNCE_WINDOW_DAYS"
                             f" ({window:g}): soft bounces are counted from the feedback"
                             f" rows of that window")
        return value

    @field_validator("feedback_secret_previous")
    @classmethod
    def _previous_beside_a_secret(cls, value: SecretStr | None,
                                  info: ValidationInfo) -> SecretStr | None:
        if value is not None and info.data.get("feedback_secret") is None:
            raise ValueError("needs POSTRELAY_FEEDBACK_SECRET, which signs what is sent "
                             "from now on")
        return value

    @field_validator("public_url")
    @classmethod
    def _public_url_beside_a_secret(cls, value: str | None,
                                    info: ValidationInfo) -> str | None:
        # The URL serves only the unsubscribe links, which the secret signs: without it the
        # URL was ignored in silence and bulk mail went out with no link.
        if value and value.strip() and info.data.get("feedback_secret") is None:
            raise ValueError("needs POSTRELAY_FEEDBACK_SECRET, which signs the unsubscribe "
                             "links it serves")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_in_any_case(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("api_forwarded_allow_ips")
    @classmethod
    def _proxy_addresses(cls, value: str | None) -> str | None:
        # Read as uvicorn reads them, which takes any entry that is not an address or a
        # network (host bits clear) for a Unix socket's path, and a `*` beside addresses
        # for such a path too: a mistyped entry trusted no proxy, silently.
        entries = [entry.strip() for entry in value.split(",")] if value else []
        if "*" in entries and len(entries) > 1:
            raise ValueError("* trusts every peer and stands alone")
        for entry in (entry for entry in entries if entry != "*"):
            try:
                if "/" in entry:
                    ipaddress.ip_network(entry)
                else:
                    ipaddress.ip_address(entry)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or network (such as "
                                 "10.0.0.0/8, host bits clear); give them separated by "
                                 "commas, or *") from None
        return value

    @field_validator("smtp_host")
    @classmethod
    def _a_host_name(cls, value: str) -> str:
        # Taken as it came, an empty or blank-holding host failed at every send, as a
        # transient connection error each email job retried until the dead-letter queue.
        if not value or any(ch.isspace() for ch in value):
            raise ValueError("must name the SMTP server: a host name or address, without "
                             "blanks")
        return value

    @field_validator("smtp_rate")
    @classmethod
    def _rate(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_rate(value)
            except ValidationError as exc:
                raise ValueError(exc.rule) from None
        return value

    # The migrate URL too: migrate connected to a foreign one with "No module named
    # 'MySQLdb'", and to a blank one with "Could not parse SQLAlchemy URL".
    @field_validator("database_url", "migrate_database_url")
    @classmethod
    def _postgresql_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        # A secret file or a YAML block often ends the value with a newline, which the
        # parser took into the database name ("prod\n" does not exist), and a leading
        # blank made the URL unreadable.
        value = value.strip()
        try:
            url = make_url(value)
        except (ArgumentError, ValueError):
            raise ValueError("not a database URL; expected "
                             "postgresql://user:password@host:5432/database") from None
        if url.drivername not in POSTGRES_DRIVERS:
            raise ValueError(f"postrelay needs PostgreSQL, not {url.drivername!r}; expected "
                             "postgresql://user:password@host:5432/database")
        if "@" in (url.host or ""):
            # The parser splits at the first @, so a password holding one was cut short and
            # the rest taken for the host: "failed to resolve host 'ss@db.internal'".
            raise ValueError("the host holds an @: write an @ in the user or password as "
                             "%40 (and :, /, # and ? as %3A, %2F, %23 and %3F)")
        return value

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # The URL's password is masked as Database() masks it; SecretStr fields mask
        # themselves.
        for name, value in super().__repr_args__():
            if name in ("database_url", "migrate_database_url") and value is not None:
                value = masked_url(value)
            yield name, value


def masked_url(url: str) -> str:
    """`url` with its password as ***, for anything a person or a log may read."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<unparsable URL>"


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment, turning a bad value into a ConfigError
    that names the environment variable and the rule it broke."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except SettingsError as exc:
        # A mapping setting (POSTRELAY_TENANT_WEIGHTS) is read as JSON before it is
        # validated, and pydantic-settings names only the field of a value it cannot parse.
        found = _UNPARSED_FIELD.search(str(exc))
        field = found.group(1) if found else "*"
        example = _JSON_EXAMPLES.get(field)
        raise ConfigError(f"invalid settings: {ENV_PREFIX}{field.upper()}: must be JSON"
                          + (f", such as {example}" if example else "")) from None
    except pydantic.ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = "_".join(str(p) for p in err["loc"])
            name = ENV_PREFIX + field.upper()
            if field in SECRET_FIELDS:  # the rule, never the value
                problems.append(f"{name}: {err['msg']}")
            else:
                problems.append(f"{name}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError("invalid settings: " + "; ".join(problems)) from None


@functools.cache
def environment_settings() -> Settings:
    """The settings of this process's environment, built on first use and kept: for the
    library functions called without settings in hand, such as `enqueue`'s default
    `max_attempts`. A service builds its own with `load_settings` and passes them down."""
    return load_settings()
