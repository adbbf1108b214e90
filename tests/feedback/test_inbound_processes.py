"""`postrelay inbound` as a process: it refuses to start without a database it can use, says
what an earlier run left in the inbox and records it; two of them on one database, as
behind two MX hosts, share the inbox, each message recorded once, by one of them, and both
take part; killed (SIGKILL) in the middle of a stream, it has lost no message it answered
250, and the next records each once, the ones sent again too."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiosmtplib
import pytest
from sqlalchemy import text

from postrelay.core.migrate import upgrade
from tests.feedback.conftest import (
    BOUNCE_DOMAIN,
    SECRET,
    await_inbox_empty,
    free_ports,
    until_listening,
)
from tests.feedback.test_inbox import bounces
from tests.migrations import throwaway_database

POSTRELAY = Path(sys.executable).parent / "postrelay"
BACKLOG = 1500  # many batches of 100: more than either process takes in one go


def receiver_env(worker_env: dict[str, str], **settings: str) -> dict[str, str]:
    return {**worker_env, "POSTRELAY_EMAIL_BOUNCE_DOMAIN": BOUNCE_DOMAIN,
            "POSTRELAY_FEEDBACK_SECRET": SECRET.decode(), **settings}


@contextmanager
def receiver_process(env: dict[str, str], host: str, port: int,
                     out: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`postrelay inbound` on host:port, what it prints in `out`; on the way out it gets
    SIGTERM and is waited for, so everything it prints is in `out` after."""
    with out.open("wb") as stdout:
        process = subprocess.Popen(
            [str(POSTRELAY), "inbound", "--host", host, "--port", str(port)],
            env=env, stdout=stdout, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def refused(env: dict[str, str], host: str | None = "127.0.0.1", code: int = 1) -> str:
    """The one line a receiver that may not start prints; it exits at once (a receiver
    that listened instead would run until the timeout), with `code` (2: a bad setting).
    `host` None: the setting's."""
    port = free_ports(1)[0]
    done = subprocess.run([str(POSTRELAY), "inbound", *(["--host", host] if host else []),
                           "--port", str(port)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "" and "Traceback" not in done.stderr, (done.stdout, done.stderr)
    (line,) = done.stderr.splitlines()
    return line


def test_a_receiver_that_cannot_reach_its_database_refuses_to_start(worker_env):
    line = refused(receiver_env(
        worker_env, POSTRELAY_DATABASE_URL="postgresql://u:s3cret@127.0.0.1:1/nope"))
    assert line.startswith("error: cannot reach the database") and "s3cret" not in line


def test_a_receiver_on_an_unmigrated_database_refuses_to_start(worker_env, server_url):
    with throwaway_database(server_url) as url:
        line = refused(receiver_env(worker_env, POSTRELAY_DATABASE_URL=url))
        assert "none of postrelay's migrations" in line and "postrelay migrate" in line
        # One migrated before the feedback inbox was: it listened, then answered 451.
        upgrade(url, "0021")
        line = refused(receiver_env(worker_env, POSTRELAY_DATABASE_URL=url))
        assert "at migration 0021" in line and "postrelay migrate" in line


def test_a_port_outside_1_to_65535_is_refused_before_it_listens(worker_env):
    """A port a socket cannot have was taken as it came: 99999 listened on 34463 (the
    number modulo 65536) while the receiver said 99999, and 0 meant the setting's 25."""
    for port in ("99999", "0", "-1"):
        done = subprocess.run([str(POSTRELAY), "inbound", "--port", port],
                              env=receiver_env(worker_env), capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2 and done.stdout == "", (port, done.stdout, done.stderr)
        assert "Invalid value for '--port'" in done.stderr, (port, done.stderr)


# A label past 63 characters ended in "unexpected UnicodeError: encoding with 'idna' codec
# failed".
@pytest.mark.parametrize("host", ["no-such-host.invalid", "a" * 70])
def test_a_host_that_names_no_address_is_refused_by_name(worker_env, host):
    line = refused(receiver_env(worker_env, POSTRELAY_INBOUND_HOST=host), host=None, code=2)
    assert line.startswith("error: --host (POSTRELAY_INBOUND_HOST): cannot listen on "
                           f"{host!r}: "), line


def test_a_port_taken_is_refused_naming_the_address(worker_env):
    """asyncio's "error while attempting to bind on address ('127.0.0.1', 25): address
    already in use", exit 1, named neither the option nor the setting."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run([str(POSTRELAY), "inbound", "--host", "127.0.0.1", "--port",
                               str(port)], env=receiver_env(worker_env), capture_output=True,
                              text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert done.stderr.splitlines() == [
        "error: --host (POSTRELAY_INBOUND_HOST) and --port (POSTRELAY_INBOUND_PORT): cannot "
        f"listen on 127.0.0.1:{port}: Address already in use"], done.stderr


def test_a_certificate_it_cannot_load_is_refused_naming_the_settings(worker_env, tmp_path):
    """A missing file, or one that holds no certificate, stopped the receiver with only
    "No such file or directory" or "[SSL] PEM lib"."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    for cert, key in ((tmp_path / "missing.pem", tmp_path / "missing.key"), (garbage, garbage)):
        line = refused(receiver_env(worker_env, POSTRELAY_INBOUND_TLS_CERT=str(cert),
                                    POSTRELAY_INBOUND_TLS_KEY=str(key)), code=2)
        assert line.startswith("error: POSTRELAY_INBOUND_TLS_CERT and "
                               f"POSTRELAY_INBOUND_TLS_KEY: cannot load {cert} and {key}: "), line


async def test_a_receiver_says_what_an_earlier_one_left_in_the_inbox_and_records_it(
        worker_env, engine, tenant, look, return_path, tmp_path):
    made = bounces(engine, tenant, return_path, 3)
    with engine.begin() as conn:  # accepted by a receiver that died before recording them
        conn.execute(text("INSERT INTO mdm.aa_feedback_inbox (envelope_to, raw) "
                          "VALUES (:to, :raw)"), [{"to": [verp], "raw": raw}
                                                  for _, verp, raw in made])
    port = free_ports(1)[0]
    out = tmp_path / "inbound.out"
    with receiver_process(receiver_env(worker_env), "127.0.0.1", port, out) as process:
        await until_listening(port)
        await await_inbox_empty(engine, timeout=30)
    assert process.returncode == 0, out.read_text()
    assert out.read_text().splitlines()[0] == (
        f"inbound: mail for {BOUNCE_DOMAIN} on 127.0.0.1:{port}; 3 accepted before, waiting "
        "to be recorded")
    assert {f["email_log_id"] for f in look.feedback()} == {s["id"] for s, _, _ in made}


async def test_an_empty_host_listens_on_every_address_of_both_families(worker_env, tmp_path):
    """`--host ""`, for an MX with both A and AAAA records: MTAs connect over either."""
    port = free_ports(1)[0]
    out = tmp_path / "inbound.out"
    with receiver_process(receiver_env(worker_env), "", port, out) as process:
        await until_listening(port)  # over IPv4
        reader, writer = await asyncio.open_connection("::1", port)
        try:
            assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"220 ")
        finally:
            writer.close()
    assert process.returncode == 0, out.read_text()
    assert out.read_text().splitlines()[0] == f"inbound: mail for {BOUNCE_DOMAIN} on *:{port}"


async def send(port: int, verp: str, raw: bytes) -> None:
    smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=10)
    await smtp.connect()
    await smtp.sendmail("", [verp], raw)
    await smtp.quit()


async def test_two_receivers_share_the_inbox_and_record_each_message_once(
        worker_env, engine, tenant, look, return_path, tmp_path):
    env = receiver_env(worker_env, POSTRELAY_LOG_LEVEL="INFO")
    made = bounces(engine, tenant, return_path, BACKLOG + 2)  # (log row, VERP, DSN) each
    sent = [log for log, _, _ in made]
    mails = [(verp, raw) for _, verp, raw in made]
    ports = free_ports(2)
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    receivers = []
    for port, log in zip(ports, logs, strict=True):
        with log.open("wb") as stderr:  # a file: a pipe would fill and stop the process
            receivers.append(subprocess.Popen(
                [str(POSTRELAY), "inbound", "--host", "127.0.0.1", "--port", str(port)],
                env=env, stdout=subprocess.DEVNULL, stderr=stderr))
    try:
        await asyncio.gather(*(until_listening(port) for port in ports))
        # Messages both stored and left behind (a receiver that died before recording
        # them), then one more to each receiver, which wakes its processor at once.
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO mdm.aa_feedback_inbox (envelope_to, raw) "
                              "VALUES (:to, :raw)"),
                         [{"to": [verp], "raw": raw} for verp, raw in mails[:BACKLOG]])
        await asyncio.gather(*(send(port, *mail)
                               for port, mail in zip(ports, mails[BACKLOG:], strict=True)))
        await await_inbox_empty(engine, timeout=60)
    finally:
        for receiver in receivers:
            receiver.send_signal(signal.SIGTERM)
        codes = [receiver.wait(timeout=30) for receiver in receivers]
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]

    # Each receiver logs every report it records: between them, every message once.
    recorded = [log.read_text().count("postrelay.feedback.bounced") for log in logs]
    assert sum(recorded) == BACKLOG + 2 and min(recorded) > 0, recorded
    feedback = look.rows("SELECT email_log_id, kind FROM mdm.aa_email_feedback")
    assert len(feedback) == BACKLOG + 2
    assert {f["email_log_id"] for f in feedback} == {s["id"] for s in sent}
    assert {f["kind"] for f in feedback} == {"bounced"}
    assert look.rows("SELECT count(*) AS n FROM mdm.aa_email_log "
                     "WHERE delivery = 'bounced'") == [{"n": BACKLOG + 2}]


KILLED_AFTER = (120, 240)  # 250s heard before each receiver in turn is killed
STREAM = 400


async def deliver_until_killed(port: int, mails: list[tuple[str, bytes]], accepted: set[str],
                               receiver: subprocess.Popen[bytes], kill_at: int) -> None:
    """Deliver `mails` over eight connections, as an MTA does, into `accepted` as each 250
    is heard; SIGKILL the receiver once `kill_at` have been. What got no 250 is left for
    the next receiver, as an MTA keeps it for a retry."""
    queue = list(mails)

    async def connection() -> None:
        smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=10)
        try:
            await smtp.connect()
            while queue:
                verp, raw = queue.pop()
                await smtp.sendmail("", [verp], raw)
                accepted.add(verp)
                if len(accepted) >= kill_at and receiver.poll() is None:
                    receiver.kill()
        except (OSError, aiosmtplib.SMTPException):
            return  # the receiver is gone

    await asyncio.gather(*(connection() for _ in range(8)))


async def test_receivers_killed_mid_stream_lose_no_message_they_accepted(
        worker_env, engine, tenant, look, return_path, tmp_path):
    made = bounces(engine, tenant, return_path, STREAM)
    mails = {verp: raw for _, verp, raw in made}
    accepted: set[str] = set()
    for round_, kill_at in enumerate(KILLED_AFTER):
        port = free_ports(1)[0]
        log = tmp_path / f"killed{round_}.log"
        with log.open("wb") as out:
            receiver = subprocess.Popen(
                [str(POSTRELAY), "inbound", "--host", "127.0.0.1", "--port", str(port)],
                env=receiver_env(worker_env), stdout=out, stderr=subprocess.STDOUT)
        try:
            await until_listening(port)
            left = [(verp, raw) for verp, raw in mails.items() if verp not in accepted]
            await deliver_until_killed(port, left, accepted, receiver, kill_at)
        finally:
            receiver.kill()
            assert receiver.wait(timeout=30) == -signal.SIGKILL, log.read_text()[-2000:]
        # Every message heard with a 250 is in the inbox or recorded, killed or not.
        kept = look.rows("SELECT DISTINCT unnest(envelope_to) AS verp "
                         "FROM mdm.aa_feedback_inbox")
        recorded = look.rows("SELECT email_log_id FROM mdm.aa_email_feedback")
        kept_or_recorded = {r["verp"] for r in kept} | {
            return_path.address(r["email_log_id"]) for r in recorded}
        assert accepted <= kept_or_recorded, len(accepted - kept_or_recorded)
        assert kill_at <= len(accepted) < STREAM

    # The last receiver takes what the others left and the rest of the stream, including
    # messages stored but killed before their 250 (sent again: recorded once).
    port = free_ports(1)[0]
    with receiver_process(receiver_env(worker_env), "127.0.0.1", port,
                          tmp_path / "last.log") as receiver:
        await until_listening(port)
        left = [(verp, raw) for verp, raw in mails.items() if verp not in accepted]
        await deliver_until_killed(port, left, accepted, receiver, STREAM + 1)
        await await_inbox_empty(engine, timeout=60)
    assert accepted == set(mails)
    feedback = look.rows("SELECT email_log_id, kind FROM mdm.aa_email_feedback")
    assert sorted(f["email_log_id"] for f in feedback) == sorted(s["id"] for s, _, _ in made)
    assert {f["kind"] for f in feedback} == {"bounced"}
    assert look.rows("SELECT count(*) AS n FROM mdm.aa_email_suppression") == [{"n": STREAM}]
    assert [e["event_type"] for e in look.events()] == ["email.bounced"] * STREAM
