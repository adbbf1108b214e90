"""What several routers share: the engine dependency, tenant scoping, documented errors."""

from __future__ import annotations

import re
from typing import Annotated, Any
from uuid import UUID

from fastapi import Depends, Path, Request
from fastapi.dependencies.models import Dependant
from pydantic import BeforeValidator
from sqlalchemy import Engine

from postrelay.api.auth import Caller, Principal, engine_of
from postrelay.api.errors import ApiError
from postrelay.api.models import ErrorEnvelope
from postrelay.queue import SYSTEM_TENANT_ID

Db = Annotated[Engine, Depends(engine_of)]
JobId = Annotated[UUID, Path(alias="id", description="The job's id.")]


_DIGITS = re.compile(r"-?[0-9]+")  # a sign, so that -1 is told the endpoint's range


def _digits(value: Any) -> Any:
    # pydantic reads "1.0", "1_000", "+5" and " 5 " as whole numbers; a count in a URL is
    # plain digits, as the bodies' counts are strict JSON integers.
    if isinstance(value, str) and not _DIGITS.fullmatch(value):
        raise ValueError(f"must be a whole number in plain digits, such as 50; got {value!r}")
    return value


# For a count in the query string: `Annotated[int, Query(ge=..., le=...), DIGITS]`. After
# the Query, so that its bounds stay in the OpenAPI document as minimum and maximum.
DIGITS = BeforeValidator(_digits)

_DESCRIPTIONS = {
    400: "Bad input; `error.field` names it.",
    401: "No key, or a wrong or revoked one.",
    403: "Refused by a rule of what this key may do; `error.code` names it "
         "(`kind_reserved`, `name_reserved`, `service_role_required`).",
    404: "Not found (or another tenant's).",
    409: "Conflicts with existing state.",
    503: "Not ready.",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error answers an endpoint can give."""
    return {s: {"model": ErrorEnvelope, "description": _DESCRIPTIONS[s]} for s in statuses}


def tenant_for_write(caller: Principal, given: UUID | None) -> UUID:
    """The tenant a new job or cron entry belongs to.

    A tenant key writes only for its own tenant (naming another is refused); the
    service-role key writes for the tenant named, or for the system tenant when none is,
    as `postrelay cron add` does.
    """
    if caller.tenant_id is None:
        return given if given is not None else SYSTEM_TENANT_ID
    if given is not None and given != caller.tenant_id:
        raise ApiError(400, "tenantId: a tenant key can only act for its own tenant",
                       field="tenantId")
    return caller.tenant_id


def query_checked(request: Request, caller: Caller) -> None:
    """400 for a query parameter the endpoint does not take, or one given twice.

    Read by FastAPI alone, `?state=dlq` (for `status`) or `?tenantId=` on the job list was
    ignored and every job came back, and `?status=done&status=dlq` kept only the last value:
    a filter silently dropped. As unknown body fields are refused, so are these. Takes the
    caller so that a request without a key is a 401 before its query is looked at.
    """
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    known = _query_names(dependant) if dependant is not None else frozenset()
    seen: set[str] = set()
    for name, _value in request.query_params.multi_items():
        if name not in known:
            takes = ", ".join(sorted(known)) if known else "none"
            raise ApiError(400, f"{name}: not a query parameter of this endpoint "
                                f"(it takes: {takes})", field=name)
        if name in seen:
            raise ApiError(400, f"{name}: given more than once; give it once", field=name)
        seen.add(name)


def _query_names(dependant: Dependant) -> frozenset[str]:
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return frozenset(names)
