"""Service settings: one pydantic-settings object, built once at the edge and passed down.

Every field reads from the environment with the `POSTRELAY_` prefix, e.g.
`POSTRELAY_JOB_RETRY_DELAY_SECS=10`.
"""

from pathlib import Path
from typing import Literal

import platformdirs
import pydantic
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from postrelay.core.errors import ConfigError

ENV_PREFIX = "POSTRELAY_"


def _default_embedded_dir() -> Path:
    return Path(platformdirs.user_data_dir("postrelay")) / "pgdata"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # None means: start the embedded PostgreSQL (pgserver) in `embedded_data_dir`.
    database_url: str | None = None
    embedded_data_dir: Path = Field(default_factory=_default_embedded_dir)

    job_retry_delay_secs: float = Field(default=5.0, ge=0)
    job_max_retries: int = Field(default=8, ge=1, le=1_000_000)
    job_backoff: Literal["fixed", "exponential"] = "fixed"
    job_backoff_max_secs: float = Field(default=3600.0, gt=0)
    job_lease_secs: float = Field(default=450.0, gt=0)
    job_retention_days: float = Field(default=14.0, gt=0)
    job_timeout_secs: float | None = Field(default=None, gt=0)

    worker_concurrency: int = Field(default=10, ge=1, le=10_000)
    worker_grace_secs: float = Field(default=30.0, ge=0)
    worker_poll_interval_secs: float = Field(default=1.0, gt=0)
    # Prometheus metrics of each worker process on http://HOST:PORT/metrics; unset: off.
    worker_metrics_port: int | None = Field(default=None, ge=1, le=65535)
    worker_metrics_host: str = "127.0.0.1"
    maintenance_interval_secs: float = Field(default=30.0, gt=0)
    # How often each worker's cron scheduler looks for due slots (schedules have seconds).
    cron_interval_secs: float = Field(default=1.0, gt=0)

    outbox_retention_days: float = Field(default=7.0, gt=0)
    relay_batch_size: int = Field(default=500, ge=1, le=10_000)
    # Failed routing attempts before an outbox event is parked as dead.
    relay_max_attempts: int = Field(default=10, ge=1)

    # LISTEN/NOTIFY wake-ups; switch off behind a pooler in transaction mode.
    notify: bool = True
    # Webhooks to loopback, private and link-local addresses are refused unless this is set.
    webhook_allow_private: bool = False

    log_level: str = "INFO"

    # The HTTP API's service-role key (`apikey` header or `Authorization: Bearer`). Without
    # one, `postrelay api` refuses to start rather than serve the queue unauthenticated.
    service_role_key: SecretStr | None = None


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment, turning a bad value into a ConfigError
    that names the environment variable and the rule it broke."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except pydantic.ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = ENV_PREFIX + "_".join(str(p) for p in err["loc"]).upper()
            problems.append(f"{name}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError("invalid settings: " + "; ".join(problems)) from None
