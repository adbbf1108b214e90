"""Who may come in, for the HTTP API and the dashboard alike: the service-role key, tenant
API keys (`aa_api_key`), the bound on failed authentication, and the names and bounds of
operator input. Both surfaces use this package, so that neither imports the other."""

from postrelay.access.controls import check_limit_change, check_resume
from postrelay.access.fields import API_FIELD_NAMES, MaxAttempts, Priority
from postrelay.access.keys import (
    MIN_SERVICE_ROLE_KEY_LENGTH,
    ApiKeyView,
    api_key_create,
    api_key_find,
    api_key_list,
    api_key_revoke,
    key_hash,
    keys_equal,
    service_role_key,
)
from postrelay.access.throttle import AuthThrottle, Refusal, auth_throttle, client_key

__all__ = [
    "API_FIELD_NAMES",
    "check_limit_change",
    "check_resume",
    "MIN_SERVICE_ROLE_KEY_LENGTH",
    "ApiKeyView",
    "AuthThrottle",
    "MaxAttempts",
    "Priority",
    "Refusal",
    "api_key_create",
    "api_key_find",
    "api_key_list",
    "api_key_revoke",
    "auth_throttle",
    "client_key",
    "key_hash",
    "keys_equal",
    "service_role_key",
]
