"""Feedback ingestion beside the send rate, in one run: Postfix DSNs per second through
`postrelay inbound` (the real aiosmtpd listener, parser and record_feedback on PostgreSQL,
one process of its own), SendGrid events per second through `postrelay api`'s signed Event Webhook
(batches of 100, one API process), and the send rate `bench.email_bench` measures (outbox
event -> relay -> worker -> SMTP -> log row, one worker) on the same machine and database.

    python -m bench.feedback_bench [--dsns 2000] [--events 5000] [--emails 2000] [--quick]
                                   [--starttls] [--inbound-processes 1]

The DSNs arrive twice over: with DATA, as Postfix sends them (PIPELINING: MAIL, RCPT and
DATA in one write, the message after the 354), and with BDAT, as Gmail, Microsoft 365 and
Exim send to a server that offers CHUNKING (the message in that same write). The send rate
and each DSN rate are the better of two runs, taken in turn, so a busy moment lowers
neither the bar nor what is measured against it.

With --inbound-processes N the DSNs go to `postrelay inbound --processes N` (N receivers
on one port), their CPU counted together.

With --starttls, DATA is measured a third way: over STARTTLS, as an MTA delivers to a
receiver that offers it (`POSTRELAY_INBOUND_TLS_CERT`), its certificate from a throw-away
authority: what encryption costs the receiver per DSN.

Each DSN and each event bounces one log row of its own (hard, 5.1.1): the whole effect is
written (feedback row, log row, suppression, outbox event). Target: ingestion at least as
fast as sending, so feedback never backs up behind the sender.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import string
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import psutil
import trustme
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy import text

from bench.email_bench import end_to_end_rate, sink_process
from bench.harness import (
    WORKER_MAIN,
    BenchDatabase,
    Row,
    WorkerProcess,
    bench_database,
    met,
    print_table,
    rate,
    ratio,
    wait_until,
)
from postrelay.orchestrator import ReturnPath, SmtpConfig, SmtpPool

FIXTURE = Path(__file__).parent.parent / "tests" / "feedback" / "mail" / "postfix_bounce.eml"
DOMAIN = "bounces.bench.example"
PUBLIC_URL = "https://mail.bench.example"
BATCH = 100
SERVICE_KEY = "bench-service-role-key-0123456789abcdef"


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _sent_rows(bench: BenchDatabase, n: int, prefix: str) -> list[tuple[uuid.UUID, str, str]]:
    """n `sent` log rows, one recipient each: (log id, recipient, Message-ID). The
    Message-ID has postrelay's own form, `<job id@domain>`, by which feedback finds a row."""
    jobs = [uuid.uuid4() for _ in range(n)]
    rows = [(uuid.uuid4(), f"{prefix}{i}@example.com", f"<{job}@mail.bench.example>")
            for i, job in enumerate(jobs)]
    with bench.engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO mdm.aa_email_log (id, tenant_id, job_id, template, from_address, "
            "recipients, to_addresses, message_id, status, attempt) VALUES (:id, :t, :j, "
            "'welcome', 'noreply@bench.example', ARRAY[:r], ARRAY[:r], :m, 'sent', 1)"),
            [{"id": i, "t": bench.tenant_id, "j": j, "r": r, "m": m}
             for (i, r, m), j in zip(rows, jobs, strict=True)])
    return rows


@dataclass(frozen=True)
class Tls:
    """A certificate for the receiver's STARTTLS and the authority its sender trusts."""

    cert: Path
    key: Path
    ca: Path


@contextmanager
def throwaway_tls() -> Iterator[Tls]:
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="postrelay-bench-tls-") as folder:
        tls = Tls(Path(folder, "cert.pem"), Path(folder, "key.pem"), Path(folder, "ca.pem"))
        issued.cert_chain_pems[0].write_to_path(str(tls.cert))
        issued.private_key_pem.write_to_path(str(tls.key))
        ca.cert_pem.write_to_path(str(tls.ca))
        yield tls


async def _smtp(port: int, mails: list[tuple[str, bytes]], connections: int,
                chunking: bool, tls: Tls | None = None) -> None:
    """Deliver `mails` over `connections` reused connections as an MTA does: through
    postrelay's own SMTP pool, which pipelines MAIL, RCPT and DATA when offered, as Postfix
    does, and sends the message in the same write as BDAT when `chunking`, as Gmail,
    Microsoft 365 and Exim do; over STARTTLS with `tls`."""
    pool = SmtpPool(SmtpConfig(host="127.0.0.1", port=port, pool_size=connections,
                               timeout_secs=30.0, chunking=chunking,
                               security="starttls" if tls else "none",
                               ca_file=tls.ca if tls else None))
    try:
        await asyncio.gather(*(pool.send("", [rcpt], raw) for rcpt, raw in mails))
    finally:
        await pool.close()


def dsn_rate(bench: BenchDatabase, n: int, connections: int, cpu: dict[str, float], *,
             chunking: bool = False, prefix: str = "dsn", tls: Tls | None = None,
             processes: int = 1) -> float:
    """DSNs/s through `postrelay inbound` in a process of its own: from the first
    connection until every DSN is recorded (its 250 says only that it is stored in the
    inbox). Each run needs a `prefix` of its own for its recipients. With `tls`, the
    receiver offers STARTTLS and every connection takes it. With `processes`, that many
    receivers share the port (`--processes`), their CPU counted together as `inbound`."""
    secret = "bench-feedback-secret-0123456789"
    path = ReturnPath(DOMAIN, secret.encode())
    template = string.Template(FIXTURE.read_text())
    mails = []
    for i, (log_id, recipient, message_id) in enumerate(_sent_rows(bench, n, prefix)):
        verp = path.address(log_id)
        raw = template.substitute(verp=verp, message_id=message_id, recipient=recipient,
                                  queue_id=f"Q{i}", domain=DOMAIN).replace("\n", "\r\n")
        raw = raw.replace("<20261201214001.3F2A1B2C3D@mx.example.net>",
                          f"<dsn-{i}@mx.example.net>")
        # Each DSN's MIME boundary is its own, as Postfix's holds the queue id.
        raw = raw.replace("3F2A1B2C3D.1764625201/", f"{i:010X}.1764625201/")
        mails.append((verp, raw.encode()))
    port = _port()
    # With a public URL as well, as a sender of bulk mail runs it: the receiver then also
    # reads `mailto:` unsubscribes (feedback/mailto.py).
    env = {"POSTRELAY_EMAIL_BOUNCE_DOMAIN": DOMAIN, "POSTRELAY_FEEDBACK_SECRET": secret,
           "POSTRELAY_PUBLIC_URL": PUBLIC_URL,
           "POSTRELAY_INBOUND_MAX_CONNECTIONS": str(connections + 5)}
    if tls is not None:
        env.update({"POSTRELAY_INBOUND_TLS_CERT": str(tls.cert),
                    "POSTRELAY_INBOUND_TLS_KEY": str(tls.key)})
    several = ["--processes", str(processes)] if processes > 1 else []
    inbound = WorkerProcess(bench, env=env, argv=["-c", WORKER_MAIN, "inbound", "--host",
                                                  "127.0.0.1", "--port", str(port), *several])
    with inbound:
        assert inbound.proc is not None
        parent = psutil.Process(inbound.proc.pid)
        if processes == 1:
            wait_until(lambda: _listening(port), timeout=60, worker=inbound,
                       what="postrelay inbound to listen")
        else:
            wait_until(lambda: len(_receivers(parent, port)) == processes, timeout=60,
                       worker=inbound, what=f"{processes} receivers to listen")
        receivers = [parent, *(_receivers(parent, port) if processes > 1 else [])]
        meter = bench.cpu_meter({"bench": os.getpid(), **{
            f"inbound {i}": p.pid for i, p in enumerate(receivers)}})
        meter.start()
        started = time.perf_counter()
        asyncio.run(_smtp(port, mails, connections, chunking, tls))
        _await_recorded(bench, n, prefix)  # a 250 says stored; the inbox is recorded after
        elapsed = time.perf_counter() - started
        spent = meter.stop()
    cpu["inbound"] = sum(spent.pop(name) for name in list(spent) if name.startswith("inbound"))
    cpu.update(spent)
    return n / elapsed


def _await_recorded(bench: BenchDatabase, n: int, prefix: str, timeout: float = 120.0) -> None:
    """Until the inbox is empty and every DSN's feedback row is there. Every 250 was heard
    before this starts, so an empty inbox means all is recorded: it alone is polled (a
    count of the feedback table at each poll would scan it, and bill the scans to the
    server's CPU per DSN), the feedback counted once it is empty."""
    deadline = time.monotonic() + timeout
    with bench.engine.connect() as conn:
        while True:
            waiting = conn.execute(text(
                "SELECT count(*) FROM mdm.aa_feedback_inbox")).scalar_one()
            conn.rollback()
            if waiting == 0:
                recorded = conn.execute(text(
                    "SELECT count(*) FROM mdm.aa_email_feedback WHERE source = 'mail' "
                    "AND recipient LIKE :prefix"), {"prefix": f"{prefix}%"}).scalar_one()
                conn.rollback()
                assert recorded == n, (recorded, n)
                return
            assert time.monotonic() < deadline, waiting
            time.sleep(0.005)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _receivers(parent: psutil.Process, port: int) -> list[psutil.Process]:
    """The receivers of `postrelay inbound --processes` (its children) listening on `port`."""
    return [child for child in parent.children() if any(
        c.status == psutil.CONN_LISTEN and c.laddr.port == port
        for c in child.net_connections(kind="tcp"))]


def sendgrid_rate(bench: BenchDatabase, n: int, connections: int,
                  cpu: dict[str, float]) -> float:
    """Events/s through `postrelay api`'s SendGrid webhook, in batches of BATCH, signed."""
    key = ec.generate_private_key(ec.SECP256R1())
    public = base64.b64encode(key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).decode()
    events = [{"email": recipient, "event": "bounce", "type": "bounce", "status": "5.1.1",
               "reason": "550 5.1.1 The email account does not exist", "smtp-id": message_id,
               "sg_event_id": f"ev-{i}", "sg_message_id": f"m{i}.filter0001", "timestamp":
               1700000000 + i}
              for i, (_, recipient, message_id) in enumerate(_sent_rows(bench, n, "sg"))]
    bodies = []
    for start in range(0, n, BATCH):
        body = json.dumps(events[start:start + BATCH]).encode()
        stamp = str(int(time.time()))
        signature = key.sign(stamp.encode() + body, ec.ECDSA(hashes.SHA256()))
        bodies.append((body, {"X-Twilio-Email-Event-Webhook-Signature":
                              base64.b64encode(signature).decode(),
                              "X-Twilio-Email-Event-Webhook-Timestamp": stamp,
                              "Content-Type": "application/json"}))
    port = _port()
    env = {"POSTRELAY_FEEDBACK_SENDGRID_PUBLIC_KEY": public,
           "POSTRELAY_SERVICE_ROLE_KEY": SERVICE_KEY}
    api = WorkerProcess(bench, env=env, argv=["-c", WORKER_MAIN, "api", "--host",
                                              "127.0.0.1", "--port", str(port)])
    base = f"http://127.0.0.1:{port}"
    with api:
        wait_until(lambda: _up(base), timeout=60, worker=api, what="the API to answer")

        async def post_all() -> None:
            queue: asyncio.Queue[tuple[bytes, dict[str, str]]] = asyncio.Queue()
            for item in bodies:
                queue.put_nowait(item)
            async with httpx.AsyncClient(base_url=base, timeout=120) as client:
                async def one() -> None:
                    while not queue.empty():
                        body, headers = queue.get_nowait()
                        answer = await client.post("/v1/email/feedback/sendgrid",
                                                   content=body, headers=headers)
                        assert answer.status_code == 200, answer.text
                await asyncio.gather(*(one() for _ in range(connections)))

        assert api.proc is not None
        meter = bench.cpu_meter({"api": api.proc.pid, "bench": os.getpid()})
        meter.start()
        started = time.perf_counter()
        asyncio.run(post_all())
        elapsed = time.perf_counter() - started
        cpu.update(meter.stop())
    with bench.engine.connect() as conn:
        recorded = conn.execute(text("SELECT count(*) FROM mdm.aa_email_feedback "
                                     "WHERE source = 'sendgrid'")).scalar_one()
    assert recorded == n, recorded
    return n / elapsed


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.feedback_bench")
    parser.add_argument("--dsns", type=int, default=None)
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--emails", type=int, default=None)
    parser.add_argument("--connections", type=int, default=10,
                        help="SMTP connections to the receiver")
    parser.add_argument("--inbound-processes", type=int, default=1,
                        help="receivers on the port (postrelay inbound --processes)")
    parser.add_argument("--posters", type=int, default=4,
                        help="webhook requests in flight at once")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--starttls", action="store_true",
                        help="also DSNs over DATA with STARTTLS")
    args = parser.parse_args()
    dsns = args.dsns or (500 if args.quick else 2000)
    events = args.events or (1000 if args.quick else 5000)
    emails = args.emails or (500 if args.quick else 2000)
    with bench_database() as bench:
        print(f"server: {bench.server}; {emails:,} emails sent by one worker (concurrency "
              f"50); {dsns:,} DSNs over {args.connections} SMTP connections to "
              + ("one inbound process" if args.inbound_processes == 1 else
                 f"{args.inbound_processes} inbound processes on one port")
              + f"; {events:,} SendGrid events in batches of {BATCH}, {args.posters} "
              "requests in flight, to one API process", flush=True)
        send, data, chunked, encrypted = _Best(), _Best(), _Best(), _Best()
        with sink_process() as sink:
            # In turn, twice, the two ways of sending DSNs in the other order the second
            # time: the better run of each is kept.
            for round_ in range(2):
                send.take(partial(end_to_end_rate, bench, sink, emails, 50))
                ways = [(data, "data"), (chunked, "bdat")]
                for best, way in ways if round_ == 0 else ways[::-1]:
                    best.take(partial(dsn_rate, bench, dsns, args.connections,
                                      chunking=way == "bdat", prefix=f"{way}{round_}-",
                                      processes=args.inbound_processes))
                if args.starttls:
                    with throwaway_tls() as tls:
                        encrypted.take(partial(dsn_rate, bench, dsns, args.connections,
                                               prefix=f"tls{round_}-", tls=tls,
                                               processes=args.inbound_processes))
        sendgrid_cpu: dict[str, float] = {}
        sendgrid = sendgrid_rate(bench, events, args.posters, sendgrid_cpu)
        with bench.engine.connect() as conn:
            suppressed = conn.execute(text(
                "SELECT count(*) FROM mdm.aa_email_suppression")).scalar_one()
    assert suppressed == (6 if args.starttls else 4) * dsns + events, suppressed
    print()
    rows = [
        Row("DSNs/s through postrelay inbound, DATA (Postfix)", rate(data.rate),
            rate(send.rate), ratio(data.rate, send.rate), ">= 1x send rate",
            met(data.rate >= send.rate)),
        Row("DSNs/s through postrelay inbound, BDAT (Gmail, M365)", rate(chunked.rate),
            rate(send.rate), ratio(chunked.rate, send.rate), ">= 1x send rate",
            met(chunked.rate >= send.rate)),
        Row("SendGrid events/s through the API", rate(sendgrid), rate(send.rate),
            ratio(sendgrid, send.rate), ">= 1x send rate", met(sendgrid >= send.rate)),
    ]
    if args.starttls:
        rows.insert(2, Row("DSNs/s through postrelay inbound, DATA over STARTTLS",
                           rate(encrypted.rate), rate(send.rate),
                           ratio(encrypted.rate, send.rate), "(no target)", "-"))
    print_table(rows)
    print("(baseline: emails/s end to end, as bench.email_bench measures it; each rate the "
          f"better of two runs: send {rate(send.rates[0])}, {rate(send.rates[1])}; DATA "
          f"{rate(data.rates[0])}, {rate(data.rates[1])}; BDAT {rate(chunked.rates[0])}, "
          f"{rate(chunked.rates[1])}; every report bounced, suppressed and emitted an outbox "
          "event)")
    print()
    # CPU per item says where the time went whatever else the machine was doing; the
    # "postgres" figure is the run's server alone (every client of it, so inflated when
    # other work shares the server); "bench" is this process: the SMTP sender of the DSNs
    # and the poster of the webhooks.
    print(_cpu_line("email sent", send.cpu, emails))
    print(_cpu_line("DSN with DATA", data.cpu, dsns))
    print(_cpu_line("DSN with BDAT", chunked.cpu, dsns))
    if args.starttls:
        print(_cpu_line("DSN with DATA over STARTTLS", encrypted.cpu, dsns))
    print(_cpu_line("SendGrid event", sendgrid_cpu, events))


class _Best:
    """The better of the runs given to `take`: its rate and the CPU it used."""

    def __init__(self) -> None:
        self.rates: list[float] = []
        self.rate = 0.0
        self.cpu: dict[str, float] = {}

    def take(self, run: Callable[..., float]) -> None:
        cpu: dict[str, float] = {}
        measured = run(cpu=cpu)
        self.rates.append(measured)
        if measured > self.rate:
            self.rate, self.cpu = measured, cpu


def _cpu_line(what: str, cpu: dict[str, float], n: int) -> str:
    parts = ", ".join(f"{name} {secs / n * 1e6:,.0f} µs"
                      for name, secs in sorted(cpu.items(), key=lambda kv: -kv[1]))
    return f"CPU per {what}: {parts}"


if __name__ == "__main__":
    main()
