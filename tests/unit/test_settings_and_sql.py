import pytest

from postrelay.core.errors import ConfigError
from postrelay.core.settings import MAX_DAYS, MAX_SECS, Settings, load_settings
from postrelay.core.sqlfiles import load_queries, parse_named_sql


def test_defaults_follow_the_seeds(monkeypatch) -> None:
    for name in ("POSTRELAY_JOB_RETRY_DELAY_SECS", "POSTRELAY_JOB_MAX_RETRIES",
                 "POSTRELAY_JOB_LEASE_SECS", "POSTRELAY_JOB_RETENTION_DAYS"):
        monkeypatch.delenv(name, raising=False)
    s = load_settings()
    assert (s.job_retry_delay_secs, s.job_max_retries, s.job_lease_secs, s.job_retention_days) == (
        5.0, 8, 450.0, 14.0)
    assert s.worker_grace_secs == 30 and s.job_backoff == "fixed"


def test_environment_overrides(monkeypatch) -> None:
    monkeypatch.setenv("POSTRELAY_JOB_MAX_RETRIES", "3")
    monkeypatch.setenv("POSTRELAY_JOB_BACKOFF", "exponential")
    s = load_settings()
    assert s.job_max_retries == 3 and s.job_backoff == "exponential"


@pytest.mark.parametrize(
    ("name", "value"),
    [("POSTRELAY_JOB_MAX_RETRIES", "0"), ("POSTRELAY_JOB_LEASE_SECS", "soon"),
     ("POSTRELAY_JOB_BACKOFF", "linear"), ("POSTRELAY_WORKER_CONCURRENCY", "-2"),
     ("POSTRELAY_SMTP_RATE", "0/s"), ("POSTRELAY_SMTP_RATE", "fast"),
     ("POSTRELAY_TENANT_WEIGHTS", '{"not-a-uuid": 2}'),
     ("POSTRELAY_TENANT_WEIGHTS", '{"00000000-0000-0000-0000-000000000001": 0}'),
     # Not JSON at all: pydantic-settings' own SettingsError, "unexpected" at the CLI.
     ("POSTRELAY_TENANT_WEIGHTS", "notjson"), ("POSTRELAY_TENANT_WEIGHTS", ""),
     ("POSTRELAY_API_FORWARDED_ALLOW_IPS", "10.0.0.1/33"),
     ("POSTRELAY_API_FORWARDED_ALLOW_IPS", "10.0.0.1,proxy.internal"),
     ("POSTRELAY_API_FORWARDED_ALLOW_IPS", "10.0.0.1,"),
     ("POSTRELAY_API_FORWARDED_ALLOW_IPS", "10.0.0.1/8"),
     ("POSTRELAY_API_FORWARDED_ALLOW_IPS", "127.0.0.1,*"),
     ("POSTRELAY_LOG_LEVEL", "verbose"),
     # Compared as an integer in SQL: past its range no routing failure could be recorded.
     ("POSTRELAY_RELAY_MAX_ATTEMPTS", "2147483648"),
     # Without POSTRELAY_FEEDBACK_SECRET it was ignored: bulk mail went out with no link.
     ("POSTRELAY_PUBLIC_URL", "https://mail.acme.example"),
     # Taken, then every send failed as a connection error, retried to the DLQ.
     ("POSTRELAY_SMTP_HOST", ""), ("POSTRELAY_SMTP_HOST", " "),
     ("POSTRELAY_SMTP_HOST", "mail.example.com smtp.example.com"),
     # Infinity, NaN and times past a century overflowed PostgreSQL's intervals in every
     # maintenance round, long after the process had started.
     ("POSTRELAY_JOB_LEASE_SECS", "inf"), ("POSTRELAY_EMAIL_LOG_RETENTION_DAYS", "infinity"),
     ("POSTRELAY_JOB_RETENTION_DAYS", "1e9"), ("POSTRELAY_SMTP_TIMEOUT_SECS", "1e300"),
     ("POSTRELAY_WORKER_CLAIM_AHEAD_SECS", "nan"),
     # Stored as one bytea value, which PostgreSQL caps at 1 GB.
     ("POSTRELAY_INBOUND_MAX_BYTES", "2000000000")],
)
def test_a_wrong_value_names_the_setting(monkeypatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert name in str(info.value)


def test_proxy_addresses_are_addresses_networks_or_a_star(monkeypatch) -> None:
    for value in ("10.0.0.1", "10.0.0.0/8, ::1", "*", "fd00::/8,192.168.0.7"):
        monkeypatch.setenv("POSTRELAY_API_FORWARDED_ALLOW_IPS", value)
        assert load_settings().api_forwarded_allow_ips == value


def test_a_log_level_is_read_in_any_case(monkeypatch) -> None:
    monkeypatch.setenv("POSTRELAY_LOG_LEVEL", "debug")
    assert load_settings().log_level == "DEBUG"


def test_a_time_of_a_century_is_taken(monkeypatch) -> None:
    monkeypatch.setenv("POSTRELAY_JOB_LEASE_SECS", str(MAX_SECS))
    monkeypatch.setenv("POSTRELAY_JOB_RETENTION_DAYS", str(MAX_DAYS))
    settings = load_settings()
    assert (settings.job_lease_secs, settings.job_retention_days) == (MAX_SECS, MAX_DAYS)


def test_named_sql_blocks() -> None:
    parsed = parse_named_sql("-- name: a\nSELECT 1;\n\n-- name: b_c\n-- why\nSELECT 2;\n")
    assert parsed == {"a": "SELECT 1", "b_c": "-- why\nSELECT 2"}
    with pytest.raises(ValueError):
        parse_named_sql("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;")


def test_queue_sql_files_load() -> None:
    queries = load_queries("postrelay.queue", "sql/job.sql", "sql/claim.sql")
    assert {"job_claim", "job_finalize_many", "job_rescue_stale", "job_delete_done_before"} <= set(
        queries)


def test_the_three_claims_return_the_same_columns() -> None:
    # The worker reads every claim's rows alike (queue/claimer.py); the three statements
    # (plain, fair, limited) spell their RETURNING list out each, and must not drift apart.
    queries = load_queries("postrelay.queue", "sql/claim.sql", "sql/limited.sql")
    returning = {name: queries[name].text.rsplit("RETURNING", 1)[1]
                 for name in ("job_claim", "job_claim_fair", "job_claim_limited")}
    assert len(set(returning.values())) == 1, returning


def test_a_name_may_appear_only_once_across_the_files_loaded_together() -> None:
    with pytest.raises(ValueError, match="job_claim"):
        load_queries("postrelay.queue", "sql/claim.sql", "sql/claim.sql")


def test_repr_and_str_of_settings_never_show_a_secret():
    settings = Settings(database_url="postgresql://app:hunter2@db.internal:5432/prod",
                        smtp_password="smtp-pw-77", service_role_key="svc-key-99")
    for shown in (repr(settings), str(settings), f"{settings}"):
        assert "hunter2" not in shown and "smtp-pw-77" not in shown and "svc-key-99" not in shown
        assert "postgresql://app:***@db.internal:5432/prod" in shown
    # The code that connects still reads the URL as it was given.
    assert settings.database_url == "postgresql://app:hunter2@db.internal:5432/prod"


@pytest.mark.parametrize("field", ["database_url", "migrate_database_url"])
def test_a_bad_database_url_is_a_config_error_that_does_not_echo_the_password(field):
    """The migrate URL was not checked at all: migrate failed on it with "No module named
    'MySQLdb'", and a bad one was echoed, password and all."""
    for url in ("mysql://app:hunter2@db/prod", "postgresql://app:hunter2@db:port/prod", "x"):
        with pytest.raises(ConfigError, match=f"POSTRELAY_{field.upper()}:") as caught:
            load_settings(**{field: url})
        assert "hunter2" not in str(caught.value)


def test_the_migrate_url_password_is_masked_in_repr():
    settings = Settings(migrate_database_url="postgresql://app:hunter2@db.internal/prod")
    assert "hunter2" not in repr(settings) and "app:***@db.internal" in repr(settings)


@pytest.mark.parametrize("field", ["database_url", "migrate_database_url"])
def test_blanks_around_a_database_url_are_not_part_of_it(field):
    """A trailing newline (a secret file's) ended up in the database name, and a leading
    blank made the URL "not a database URL"."""
    settings = load_settings(**{field: " postgresql://app@db.internal:5432/prod\n"})
    assert getattr(settings, field) == "postgresql://app@db.internal:5432/prod"


def test_an_at_sign_left_in_a_password_is_named_not_taken_for_the_host():
    """"postgresql://app:p@ss@db/prod" was read as password "p" on host "ss@db": every
    command failed with "failed to resolve host 'ss@db'"."""
    with pytest.raises(ConfigError) as caught:
        load_settings(database_url="postgresql://app:hunt@r2@db.internal:5432/prod")
    assert "POSTRELAY_DATABASE_URL: " in str(caught.value) and "%40" in str(caught.value)
    assert "hunt" not in str(caught.value)
    encoded = load_settings(database_url="postgresql://app:hunt%40r2@db.internal:5432/prod")
    assert encoded.database_url == "postgresql://app:hunt%40r2@db.internal:5432/prod"


@pytest.mark.parametrize("value", ["300000", " 300000 ", "300_000", "+300000", "300000.0",
                                   "300000.5", "3e5", "0x10000", "1023", "nonsense"])
def test_the_payload_cap_is_read_alike_at_start_and_at_each_write(monkeypatch, value):
    """Each write reads POSTRELAY_MAX_PAYLOAD_BYTES itself. "300000.0" passed the check at
    start, then failed every enqueue and emit of the process with a ConfigError."""
    from postrelay.core.limits import max_payload_bytes

    monkeypatch.setenv("POSTRELAY_MAX_PAYLOAD_BYTES", value)
    try:
        at_start: int | None = load_settings().max_payload_bytes
    except ConfigError:
        at_start = None
    try:
        at_write: int | None = max_payload_bytes()
    except ConfigError:
        at_write = None
    assert at_write == at_start
