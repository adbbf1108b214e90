"""Who is calling: the service-role key (everything) or a tenant key (one tenant's data).

The key travels as the `apikey` header (as in the seed's curl lines) or as
`Authorization: Bearer <key>`. The service-role key is compared in constant time (their
sha256 digests, so not even its length shows); tenant keys are looked up by their sha256
(see keys.py). Failed attempts are bounded per client and in all (throttle.py): past the
bound the answer is 429 with Retry-After, before the key is looked at.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated
from uuid import UUID

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine

from postrelay.access import AuthThrottle, api_key_find, keys_equal
from postrelay.api.errors import ApiError
from postrelay.core.telemetry import event

SERVICE_ROLE_ACTOR = "api:service-role"

# auto_error=False: a missing key must answer our 401 envelope, not FastAPI's 403.
_apikey_header = APIKeyHeader(name="apikey", scheme_name="apikey", auto_error=False,
                              description="The service-role key or a tenant key.")
_bearer = HTTPBearer(scheme_name="bearer", auto_error=False,
                     description="The same key as `Authorization: Bearer`.")


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller. `tenant_id` None means the service role: every tenant."""

    actor: str
    tenant_id: UUID | None

    @property
    def is_service_role(self) -> bool:
        return self.tenant_id is None


def engine_of(request: Request) -> Engine:
    return request.app.state.engine  # type: ignore[no-any-return]  # Starlette's untyped app.state


def principal(
    request: Request,
    apikey: Annotated[str | None, Security(_apikey_header)] = None,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None,
) -> Principal:
    """The FastAPI dependency every protected endpoint uses; 401 for no or a wrong key."""
    # `bearer` is declared for the OpenAPI document; the raw header is read below so that a
    # malformed Authorization header is refused rather than silently ignored.
    # Every value of both headers: a second `apikey` line (a proxy adding its own, say) must
    # not go unread while the first one decides who is calling.
    key = _presented_key(request.headers.getlist("apikey"),
                         request.headers.getlist("authorization"))
    throttle: AuthThrottle = request.app.state.auth_throttle
    client = request.client.host if request.client else None
    refusal = throttle.check(client)
    if refusal is not None:  # before the key is looked at: the answer must not tell
        raise ApiError(429, refusal.message, headers={"Retry-After": str(refusal.retry_after)})
    service_key: bytes = request.app.state.service_role_key
    if keys_equal(key, service_key):
        throttle.succeeded(client)
        return Principal(SERVICE_ROLE_ACTOR, None)
    with engine_of(request).connect() as conn:
        found = api_key_find(conn, key)
    if found is None:
        throttle.failed(client, key)
        event("postrelay.api.auth_refused", logging.WARNING, client=client)
        raise _unauthorized("invalid API key")
    throttle.succeeded(client)
    name, tenant_id = found
    return Principal(f"api:key:{name}", tenant_id)


def _presented_key(apikeys: list[str], authorizations: list[str]) -> str:
    """The one key the request carries. Clients such as the seed's send the same key in
    both headers; two different keys, in one header repeated or across both, are refused,
    never resolved by picking one."""
    keys = {apikey for apikey in apikeys if apikey}
    for authorization in authorizations:
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            raise _unauthorized("the Authorization header must be `Bearer <key>`")
        keys.add(credentials.strip())
    if not keys:
        raise _unauthorized("no API key: send it as the `apikey` header or "
                            "`Authorization: Bearer <key>`")
    if len(keys) > 1:
        raise _unauthorized("the apikey and Authorization headers carry different keys "
                            "(send one key, once)")
    return keys.pop()


def service_role(caller: Annotated[Principal, Depends(principal)]) -> Principal:
    """Like `principal`, but only the service-role key passes (installation-wide data)."""
    if not caller.is_service_role:
        # 403, not 401 (RFC 9110 15.5.4): the key is right and not revoked, only not enough;
        # a 401 with WWW-Authenticate told the client to check or replace a key that works.
        raise ApiError(403, "this endpoint needs the service-role key; a tenant key sees "
                            "only its own tenant", code="service_role_required")
    return caller


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, headers={"WWW-Authenticate": 'Bearer realm="postrelay"'})


Caller = Annotated[Principal, Depends(principal)]
ServiceRole = Annotated[Principal, Depends(service_role)]
