"""Print the CPU per message of each part of the `email_send` handler's own work, outside
the queue, the database and SMTP: the payload, the addresses, the Message-ID, the render
(bench/email_templates, as email_bench renders it), the MIME build, its bytes and the
header-line check.

    .venv/bin/python -m bench.email_parts_bench [--messages 10000] [--rounds 5]

Every message has a recipient of its own, as in email_bench, so the address cache helps
only with the From address and the domains. Each figure is the fastest of the rounds
(process CPU time): on a shared machine, the fastest round is the least disturbed.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from postrelay.orchestrator.addresses import parse_address, parse_addresses
from postrelay.orchestrator.job import EmailJob
from postrelay.orchestrator.message import (
    build_message,
    check_header_lines,
    message_id_domain,
    message_id_for,
)
from postrelay.orchestrator.templates import Templates

TEMPLATES = Path(__file__).parent / "email_templates"
SENDER = "Bench <bench@postrelay.example>"


def payloads(first: int, n: int) -> list[dict[str, Any]]:
    """What the relay writes for email_bench's route, recipient `user{i}@example.com`."""
    return [{"template": "welcome", "to": [f"user{i}@example.com"], "cc": [], "bcc": [],
             "from": None, "reply_to": [], "category": None,
             "context": {"user": {"name": f"User {i}", "email": f"user{i}@example.com"}},
             "event_id": str(uuid.uuid4())} for i in range(first, first + n)]


def one_round(first: int, n: int, templates: Templates) -> dict[str, float]:
    """CPU seconds of each part over `n` messages."""
    spent: dict[str, float] = {}
    tenant_keys = ("bench", str(uuid.uuid4()))

    def timed(name: str, work: Callable[[], list[Any]]) -> list[Any]:
        started = time.process_time()
        result = work()
        spent[name] = time.process_time() - started
        return result

    raw = payloads(first, n)
    job_ids = [uuid.uuid4() for _ in range(n)]
    specs = timed("payload", lambda: [EmailJob.from_payload(p) for p in raw])
    addresses = timed("addresses", lambda: [(
        parse_address(s.sender or SENDER, field="from"), parse_addresses(list(s.to), field="to"),
        parse_addresses(list(s.cc), field="cc"), parse_addresses(list(s.reply_to),
                                                                 field="reply_to"),
    ) for s in specs])
    ids = timed("message_id", lambda: [message_id_for(j, message_id_domain(None, a[0]))
                                       for j, a in zip(job_ids, addresses, strict=True)])
    rendered = timed("render", lambda: [templates.render(s.template, s.context,
                                                         tenant_keys=tenant_keys)
                                        for s in specs])
    messages = timed("build", lambda: [
        build_message(rendered=r, sender=a[0], to=a[1], cc=a[2], reply_to=a[3], message_id=m)
        for r, a, m in zip(rendered, addresses, ids, strict=True)])
    data = timed("as_bytes", lambda: [m.as_bytes() for m in messages])
    timed("header_lines", lambda: [check_header_lines(d) for d in data])
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.email_parts_bench")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    templates = Templates(TEMPLATES)
    best: dict[str, float] = {}
    for r in range(args.rounds):
        for name, secs in one_round(10_000_000 * (r + 1), args.messages, templates).items():
            best[name] = min(best.get(name, secs), secs)
    parts = "  ".join(f"{name} {secs / args.messages * 1e6:.1f}" for name, secs in best.items())
    total = sum(best.values()) / args.messages * 1e6
    print(f"µs per message (fastest of {args.rounds} rounds of {args.messages:,}): {parts}; "
          f"{total:.1f} in all")


if __name__ == "__main__":
    main()
