"""Provider webhook deliveries recorded at the same time, over real HTTP: SendGrid posts
several batches in parallel and retries one it timed out on, SNS delivers SES notifications
at once. Batches that touch the same feedback, log rows, addresses and soft-bounce counts in
opposite orders are all answered 200, and each event is recorded once with all its effects.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from postrelay.orchestrator.feedback.model import EVENTS
from tests.api.server import UNTHROTTLED, serve_database
from tests.feedback.conftest import Look, insert_log
from tests.feedback.test_webhook_sendgrid import PUBLIC, URL, signed
from tests.feedback.test_webhook_ses import NOWHERE, bounce_note, pinned, sns  # noqa: F401
from tests.feedback.test_webhook_ses import post as ses_post

ROWS = 24  # log rows, each to two addresses of its own
ROUNDS = 6
THREADS = 4


@pytest.fixture(scope="module")
def served(database_url: str) -> Iterator[str]:
    with serve_database(database_url, "svc-key-for-the-webhook-concurrency-tests-1",
                        feedback_sendgrid_public_key=PUBLIC, **UNTHROTTLED) as url:
        yield url


def at_once(calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    """Run the calls on threads of their own, released together."""
    start = threading.Barrier(len(calls))
    answers: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        start.wait()
        try:
            answers[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001 (reported below, with the others)
            answers[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return answers


def events_of(sent: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """Per log row: a delay, a soft bounce and a hard bounce of its first address, a
    delivery and a complaint of its second; the event ids carry `tag`."""
    found = []
    for row in sent:
        first, second = row["recipients"]
        common = {"smtp-id": row["message_id"], "timestamp": 1700000000}
        found += [
            {**common, "email": first, "event": "deferred", "response": "451 4.7.1 later",
             "sg_event_id": f"{tag}-{row['id']}-d"},
            {**common, "email": first, "event": "bounce", "type": "bounce",
             "status": "4.2.2", "reason": "452 4.2.2 mailbox full",
             "sg_event_id": f"{tag}-{row['id']}-s"},
            {**common, "email": first, "event": "bounce", "type": "bounce",
             "status": "5.1.1", "reason": "550 5.1.1 no such user",
             "sg_event_id": f"{tag}-{row['id']}-b"},
            {**common, "email": second, "event": "delivered", "response": "250 OK",
             "sg_event_id": f"{tag}-{row['id']}-ok"},
            {**common, "email": second, "event": "spamreport",
             "sg_event_id": f"{tag}-{row['id']}-c"},
        ]
    return found


def test_parallel_sendgrid_batches_in_opposite_orders_are_all_recorded_once(
        served: str, engine: Any, tenant: uuid.UUID, look: Look) -> None:
    recorded_ids: set[str] = set()
    with httpx.Client(base_url=served, timeout=60) as client:
        for round_no in range(ROUNDS):
            with engine.begin() as conn:
                sent = [insert_log(conn, tenant_id=tenant,
                                   recipients=(f"a{round_no}-{i}@example.com",
                                               f"b{round_no}-{i}@example.com"))
                        | {"recipients": (f"a{round_no}-{i}@example.com",
                                          f"b{round_no}-{i}@example.com")}
                        for i in range(ROWS)]
            same = events_of(sent, f"r{round_no}")  # posted twice: a retry while in flight
            other = events_of(sent, f"r{round_no}x")  # other events about the same rows
            batches = [same, same[::-1], other, other[::-1]][:THREADS]
            answers = at_once([lambda b=b: client.post(URL, **signed(b)) for b in batches])
            problems = [a if isinstance(a, Exception) else (a.status_code, a.text)
                        for a in answers if isinstance(a, Exception) or a.status_code != 200]
            assert not problems, problems
            recorded_ids |= {e["sg_event_id"] for b in batches for e in b}
    feedback = look.rows("SELECT id, source_event_id, kind FROM mdm.aa_email_feedback")
    assert sorted(f["source_event_id"] for f in feedback) == sorted(recorded_ids)
    # One outbox event per report recorded (all are matched; a delay has no event).
    assert sorted(e["payload"]["feedback_id"] for e in look.events()) == sorted(
        str(f["id"]) for f in feedback if f["kind"] in EVENTS)
    suppressed = look.suppressed(tenant)
    assert set(suppressed) == {(f"{p}{r}-{i}@example.com", "")
                               for p in "ab" for r in range(ROUNDS) for i in range(ROWS)}
    delivery = {r["delivery"] for r in look.rows("SELECT delivery FROM mdm.aa_email_log")}
    assert delivery == {"complained"}


def soft(row: dict[str, Any], address: str, tag: str) -> dict[str, Any]:
    """A soft bounce (mailbox full) of `address`, one of `row`'s recipients."""
    return {"smtp-id": row["message_id"], "timestamp": 1700000000, "email": address,
            "event": "bounce", "type": "bounce", "status": "4.2.2",
            "reason": "452 4.2.2 mailbox full", "sg_event_id": tag}


def test_soft_bounces_of_one_address_in_parallel_deliveries_add_up(
        served: str, engine: Any, tenant: uuid.UUID, look: Look) -> None:
    """Three deliveries at once, each with a soft bounce of the same eight addresses (the
    limit is three): each one's count took the others' as not there (uncommitted), and
    none of the addresses was suppressed."""
    with httpx.Client(base_url=served, timeout=60) as client:
        for round_no in range(ROUNDS):
            addresses = [f"s{round_no}-{i}@example.com" for i in range(8)]
            with engine.begin() as conn:
                sent = [insert_log(conn, tenant_id=tenant, recipients=tuple(addresses))
                        | {"recipients": addresses} for _ in range(3)]
            batches = [[soft(row, a, f"{round_no}-{k}-{a}")
                        for a in (addresses if k % 2 else addresses[::-1])]
                       for k, row in enumerate(sent)]
            answers = at_once([lambda b=b: client.post(URL, **signed(b)) for b in batches])
            assert [a.status_code for a in answers] == [200] * 3
    assert len(look.suppressed(tenant)) == 8 * ROUNDS


def ses_bounce(message_id: str, order: list[str], feedback_id: str) -> dict[str, str]:
    """An SNS message of an SES bounce of these recipients, in this order."""
    bounced = [{"emailAddress": a, "action": "failed", "status": "5.1.1",
                "diagnosticCode": "smtp; 550 5.1.1 user unknown"} for a in order]
    return sns("Notification", bounce_note(message_id, bouncedRecipients=bounced,
                                           feedbackId=feedback_id), cert_url=NOWHERE)


def test_parallel_ses_notifications_of_one_bounce_in_opposite_orders_are_recorded_once(
        pinned: str, engine: Any, tenant: uuid.UUID, look: Look) -> None:  # noqa: F811
    """SES publishes a bounce to every topic that asks (an identity's, a configuration
    set's), so SNS delivers it twice at once; here its recipients come in opposite orders,
    with another bounce of the same message (its own feedbackId) beside them."""
    addresses = [f"many{i}@example.com" for i in range(30)]
    with httpx.Client(base_url=pinned, timeout=60) as client:
        for round_no in range(ROUNDS):
            with engine.begin() as conn:
                sent = insert_log(conn, tenant_id=tenant, recipients=tuple(addresses))

            mid = sent["message_id"]
            notes = [ses_bounce(mid, addresses, f"fb-{round_no}"),
                     ses_bounce(mid, addresses[::-1], f"fb-{round_no}"),
                     ses_bounce(mid, addresses[::-1], f"other-{round_no}"),
                     ses_bounce(mid, addresses, f"other-{round_no}")]
            answers = at_once([lambda n=n: ses_post(client, n) for n in notes])
            assert [a.status_code for a in answers] == [200] * len(notes), [
                a.text for a in answers]
    feedback = look.rows("SELECT id, source_event_id, recipient FROM mdm.aa_email_feedback")
    assert sorted((f["source_event_id"], f["recipient"]) for f in feedback) == sorted(
        (f"{kind}-{r}", a) for kind in ("fb", "other") for r in range(ROUNDS)
        for a in addresses)
    assert sorted(e["payload"]["feedback_id"] for e in look.events()) == sorted(
        str(f["id"]) for f in feedback)
    assert set(look.suppressed(tenant)) == {(a, "") for a in addresses}
