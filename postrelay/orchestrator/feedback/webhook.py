"""What the provider webhooks (SES, Postmark, SendGrid) share: the refusal of a request that
fails authentication, the reading of providers' fields, and recording a whole delivery in
one transaction.

    reports = sendgrid_reports(events)            # pure: payload -> [Feedback]
    done = record_batch(engine, reports, policy)  # one transaction for the batch
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine

from postrelay.core.conflicts import ATTEMPTS, conflict_state, in_transaction
from postrelay.core.errors import PostrelayError, ValidationError
from postrelay.orchestrator.feedback.model import (
    ENHANCED,
    Feedback,
    Recorded,
    SuppressionPolicy,
)
from postrelay.orchestrator.feedback.record import record_many

_FRACTION = re.compile(r"(\.\d{6})\d+")
DETAIL_CHARS = 2000


class WebhookAuthError(PostrelayError):
    """The request did not prove it came from the provider (a wrong password, a bad
    signature, a certificate from a host not allowed): answered 401, nothing written."""


class WebhookUnavailableError(PostrelayError):
    """The delivery cannot be taken now: verification could not be done (the signing
    certificate could not be fetched), or recording it kept losing to concurrent ones
    (deadlocks). Answered 503, so the provider retries; nothing was written."""


def check_fresh(name: str, signed_at: float, now: float, tolerance_secs: float,
                setting: str) -> None:
    """WebhookAuthError unless `signed_at` (seconds since 1970: the time a provider signed
    with the request) is within `tolerance_secs` of `now`, either way: a signed request
    captured once is otherwise taken again whenever it is replayed."""
    age = now - signed_at
    if abs(age) <= tolerance_secs:
        return
    how = f"{age:.0f} s old" if age > 0 else f"{-age:.0f} s ahead of this host's clock"
    raise WebhookAuthError(f"{name} is {how}, more than the {tolerance_secs:g} s allowed "
                           f"({setting}): a replayed request, or a clock that is off")


def record_batch(engine: Engine, reports: Sequence[Feedback],
                 policy: SuppressionPolicy, attempts: int = ATTEMPTS) -> list[Recorded]:
    """Record every report of one webhook delivery in one transaction: all or nothing, and
    one commit for a batch of a hundred events rather than a hundred. A transaction that
    loses to a concurrent one (a deadlock) runs again; WebhookUnavailableError when it
    still loses after `attempts`."""
    try:
        return in_transaction(engine, lambda conn: record_many(conn, reports, policy),
                              what="feedback.webhook", attempts=attempts)
    except Exception as exc:
        if conflict_state(exc) is None:
            raise
        raise WebhookUnavailableError(
            f"recording the delivery lost to concurrent ones {attempts} times "
            f"(SQLSTATE {conflict_state(exc)}); nothing was recorded") from exc


def summary(done: Sequence[Recorded], ignored: int = 0) -> dict[str, int]:
    """What a webhook answers: counts the provider's logs can show."""
    return {"recorded": sum(1 for d in done if not d.duplicate),
            "duplicates": sum(1 for d in done if d.duplicate),
            "matched": sum(1 for d in done if d.matched_by is not None),
            "ignored": ignored}


def field(obj: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str,
          *, required: bool = True) -> Any:
    """`obj[name]` when it has the type a provider sends; ValidationError naming the field
    otherwise (`where` is its path in the payload)."""
    value = obj.get(name)
    if value is None:
        if required:
            raise ValidationError(f"{where}{name}", "required")
        return None
    # JSON's true is no number: bool is an int subclass in Python.
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _tuple(kind)):
        names = " or ".join(k.__name__ for k in _tuple(kind))
        raise ValidationError(f"{where}{name}", f"must be {_article(names)}")
    return value


def obj(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValidationError(where or "body", "must be a JSON object")
    return value


def status_of(*texts: str | None) -> str | None:
    """The first enhanced status code (5.1.1) in the texts a provider gives."""
    for text in texts:
        if text:
            found = ENHANCED.search(text)
            if found:
                return found.group(0)
    return None


def iso_time(value: str | None, where: str) -> datetime | None:
    """An ISO 8601 time as providers write it (`Z`, up to 7 fractional digits), in UTC.
    Refused when UTC cannot hold it: year 1 at +14:00 is a year before it there, which
    PostgreSQL stores and no list of feedback could load back."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(_FRACTION.sub(r"\1", value.replace("Z", "+00:00")))
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC)
    except (ValueError, OverflowError):
        raise ValidationError(where, "must be an ISO 8601 time in years 1 to 9999 (UTC)") \
            from None


def short(value: Any) -> str | None:
    return None if value is None else str(value)[:DETAIL_CHARS]


def _tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _article(names: str) -> str:
    word = {"str": "a string", "int": "an integer", "float": "a number", "list": "a list",
            "dict": "an object", "Mapping": "an object", "bool": "true or false"}
    return " or ".join(word.get(n, n) for n in names.split(" or "))
