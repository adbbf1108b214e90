"""Operator input as the API and the dashboard both check and name it: the bounds of a job's
priority and attempts, and the API's spelling of postrelay's field names (the dashboard's
error messages name a field the way the API does)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from postrelay.queue import INT_MAX, SMALLINT_MAX, SMALLINT_MIN

# strict: JSON `true` is not the number 1, nor "5" the number 5.
Priority = Annotated[int, Field(strict=True, ge=SMALLINT_MIN, le=SMALLINT_MAX)]
MaxAttempts = Annotated[int, Field(strict=True, ge=1, le=INT_MAX)]

# postrelay's Python names of inputs, as the API's bodies and paths spell them.
API_FIELD_NAMES = {
    "tenant_id": "tenantId",
    "max_attempts": "maxAttempts",
    "idempotency_key": "idempotencyKey",
    "delay": "delaySecs",
    "job_id": "id",
    "created_from": "createdFrom",
    "created_to": "createdTo",
    "event_id": "eventId",
    "event_types": "eventTypes",
    "ca_pem": "caPem",
    "endpoint_id": "id",
}
