"""A Python client for postrelay's HTTP admin API, sync (`Client`) and async (`AsyncClient`).

    from postrelay.client import Client

    with Client("http://127.0.0.1:8000", key) as api:
        job = api.enqueue_job("reindex", {"order": 42}, delay_secs=60, max_attempts=3)
        print(api.get_job(job["id"])["status"])

Methods return the answer's `data`: jobs, cron entries, pauses, limits, outbox events and
webhook endpoints as dicts with the API's field names, or a count (`requeue_dlq`,
`cancel_jobs`, `replay_outbox`); `add_webhook` returns the endpoint and its secret;
`list_throttles` returns the limits' answer's `meta.throttled`. An error answer raises
`ApiError` with its `status`, `code` and `message` (and `retry_after`, in seconds, when the
API or a proxy asks to wait); a redirect is not followed (the key would go along) but
raised, naming where it points. No answer at all (the
connection refused, a timeout, an answer that cannot be decoded) raises
`ApiConnectionError`, an `ApiError` whose status is 0. A url that is not http(s) or a key no
header can carry is a ValueError when the client is made.
"""

from postrelay.client._async import AsyncClient
from postrelay.client._calls import ApiConnectionError, ApiError
from postrelay.client._sync import Client

__all__ = ["ApiConnectionError", "ApiError", "AsyncClient", "Client"]
