"""Tenant-scoped API keys: create (the key is shown once), list, revoke, and look up.

A key is `secrets.token_urlsafe(32)` (256 random bits); only its sha256 is stored. Plain
functions on the caller's sync Connection; they never commit. The key's row names who made
it and who revoked it (`actor`, as the flow controls' audit rows do).

    with engine.begin() as conn:
        view, key = api_key_create(conn, "billing-app", tenant_id=tenant, actor="ops:alice")
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy import Connection

from postrelay.core.errors import ConfigError, ConflictError, NotFoundError, ValidationError
from postrelay.core.limits import checked_text
from postrelay.core.settings import Settings
from postrelay.core.sqlfiles import load_queries
from postrelay.queue import SYSTEM_TENANT_ID

API_KEY_SQL = load_queries("postrelay.access", "sql/api_key.sql")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
# The service-role key opens every tenant: at least this long (`secrets.token_urlsafe(32)`
# gives 43 characters), so that guessing it is hopeless even without the sign-in throttle.
MIN_SERVICE_ROLE_KEY_LENGTH = 32
GENERATE_HINT = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def service_role_key(settings: Settings) -> bytes:
    """The configured service-role key; ConfigError naming POSTRELAY_SERVICE_ROLE_KEY and the
    rule when there is none, or it is shorter than 32 characters, padded with spaces or not
    printable ASCII."""
    key = settings.service_role_key.get_secret_value() if settings.service_role_key else ""
    if not key.strip():
        raise ConfigError("POSTRELAY_SERVICE_ROLE_KEY is not set: the HTTP API refuses to "
                          "start without a service-role key")
    if key != key.strip():
        raise ConfigError("POSTRELAY_SERVICE_ROLE_KEY must not begin or end with whitespace")
    if not key.isascii() or not key.isprintable():
        # A header reaches the API as Latin-1 (RFC 9110), so a key with any other character
        # could never match what a client sends.
        raise ConfigError("POSTRELAY_SERVICE_ROLE_KEY must be printable ASCII: an HTTP "
                          f"header carries nothing else; generate one with {GENERATE_HINT}")
    if len(key) < MIN_SERVICE_ROLE_KEY_LENGTH:
        raise ConfigError(f"POSTRELAY_SERVICE_ROLE_KEY must be at least "
                          f"{MIN_SERVICE_ROLE_KEY_LENGTH} characters long (it has {len(key)}); "
                          f"generate one with {GENERATE_HINT}")
    return key.encode("utf-8")


def keys_equal(presented: str, expected: bytes) -> bool:
    """Whether `presented` is `expected`, in constant time: the sha256 digests are compared,
    so not even the key's length shows in the timing."""
    return hmac.compare_digest(hashlib.sha256(presented.encode("utf-8")).digest(),
                               hashlib.sha256(expected).digest())


@dataclass(frozen=True, slots=True)
class ApiKeyView:
    """One key as an operator sees it (never the key itself)."""

    id: UUID
    name: str
    tenant_id: UUID
    created_at: datetime
    created_by: str | None  # None: made before migration 0035 recorded it
    revoked_at: datetime | None
    revoked_by: str | None


def key_hash(key: str) -> str:
    """The stored form of a key: its sha256 as hex."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def api_key_create(conn: Connection, name: str, *, tenant_id: UUID | str,
                   actor: str) -> tuple[ApiKeyView, str]:
    """Create a key bound to one tenant, made by `actor`; returns the key's row and the key
    (shown once)."""
    _check_actor(actor)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValidationError("name", "1-128 characters: letters, digits and . _ : - "
                                      "(starting with a letter or digit)")
    try:
        tenant = tenant_id if isinstance(tenant_id, UUID) else UUID(str(tenant_id))
    except ValueError:
        raise ValidationError("tenant_id", f"must be a UUID, got {tenant_id!r}") from None
    if tenant == SYSTEM_TENANT_ID:
        # Its rows are postrelay's own (retention, maintenance): a key there could pause
        # or cancel them for every tenant.
        raise ValidationError("tenant_id", "the system tenant runs postrelay's own jobs; "
                                           "bind the key to one of your tenants")
    key = secrets.token_urlsafe(32)
    params = {"name": name, "tenant_id": tenant, "key_hash": key_hash(key), "actor": actor}
    row = conn.execute(API_KEY_SQL["api_key_insert"], params).first()
    if row is not None:
        return ApiKeyView(**row._mapping), key
    tenant_exists, _ = conn.execute(API_KEY_SQL["api_key_insert_diagnose"], params).one()
    if not tenant_exists:
        raise ValidationError("tenant_id", f"no tenant with id {tenant}")
    raise ConflictError(f"an API key named {name!r} already exists")


def api_key_list(conn: Connection) -> list[ApiKeyView]:
    """Every key, revoked ones included, by name."""
    return [ApiKeyView(**row._mapping) for row in conn.execute(API_KEY_SQL["api_key_list"])]


def api_key_revoke(conn: Connection, name: str, *, actor: str) -> ApiKeyView:
    """Revoke a key by name, by `actor`: it stops working at once (a request whose key was
    checked before the revocation commits still finishes). Unknown name: NotFoundError.
    Revoking again keeps the first revocation's time and actor."""
    _check_actor(actor)
    # Only what no column can hold is refused, not the naming rule of api_key_create: a
    # name stored before that rule was enforced can still be revoked.
    checked_text(name, "name")
    row = conn.execute(API_KEY_SQL["api_key_revoke"], {"name": name, "actor": actor}).first()
    if row is None:
        raise NotFoundError(f"no API key named {name!r}")
    return ApiKeyView(**row._mapping)


def _check_actor(actor: str) -> None:
    if not isinstance(actor, str) or not actor.strip():
        raise ValidationError("actor", "must be a non-empty string")
    checked_text(actor, "actor")


def api_key_find(conn: Connection, key: str) -> tuple[str, UUID] | None:
    """The (name, tenant id) of the active key `key`, or None."""
    digest = key_hash(key)
    row = conn.execute(API_KEY_SQL["api_key_find_active"], {"key_hash": digest}).first()
    if row is None or not hmac.compare_digest(row.key_hash, digest):
        return None
    return row.name, row.tenant_id
