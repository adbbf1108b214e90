"""`postrelay feedback ingest` and `postrelay feedback list` as real processes: single
messages, mbox files, Maildir folders and stdin."""

from __future__ import annotations

import json
import mailbox
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.feedback.conftest import (
    BOUNCE_DOMAIN,
    SECRET,
    await_inbox_empty,
    bounce_mail,
    insert_log,
    until_listening,
)
from tests.migrations import throwaway_database

POSTRELAY = Path(sys.executable).parent / "postrelay"


def run(env, *args, stdin: bytes | None = None, ok: bool = True):
    done = subprocess.run([str(POSTRELAY), *args], env=env, input=stdin, capture_output=True,
                          timeout=60)
    if ok:
        assert done.returncode == 0, done.stderr.decode()
    return done


def with_bounce_domain(worker_env):
    return {**worker_env, "POSTRELAY_EMAIL_BOUNCE_DOMAIN": BOUNCE_DOMAIN,
            "POSTRELAY_FEEDBACK_SECRET": SECRET.decode()}


def sent_rows(engine, tenant, n):
    """`n` log rows, the i-th sent to u<i>@example.com."""
    with engine.begin() as conn:
        return [insert_log(conn, tenant_id=tenant, recipients=(f"u{i}@example.com",))
                for i in range(n)]


def test_ingest_reads_messages_mboxes_maildirs_and_stdin(worker_env, engine, tenant, look,
                                                         return_path, tmp_path):
    env = with_bounce_domain(worker_env)
    logs = sent_rows(engine, tenant, 5)

    def mail(name, i):
        return bounce_mail(name, verp=return_path.address(logs[i]["id"]),
                           message_id=logs[i]["message_id"], recipient=f"u{i}@example.com")

    single = tmp_path / "one.eml"
    single.write_bytes(mail("postfix_bounce.eml", 0))
    box = mailbox.mbox(str(tmp_path / "bounces.mbox"))
    box.add(mail("gmail_bounce.eml", 1))
    box.add(mail("exim_bounce.eml", 2))
    box.flush()
    box.close()
    folder = mailbox.Maildir(str(tmp_path / "Maildir"), create=True)
    folder.add(mail("m365_ndr.eml", 3))
    out = run(env, "feedback", "ingest", str(single), str(tmp_path / "bounces.mbox"),
              str(tmp_path / "Maildir")).stdout.decode()
    assert out.count("matched by verp") == 4 and out.count("suppressed") == 4
    out = run(env, "feedback", "ingest", "-", stdin=mail("postfix_delivered.eml", 4))
    assert b"email.delivered" in out.stdout
    again = run(env, "feedback", "ingest", str(single)).stdout.decode()
    assert "already recorded" in again

    assert {a for a, _ in look.suppressed(tenant)} == {f"u{i}@example.com" for i in range(4)}
    listed = json.loads(run(env, "feedback", "list", "--json", "--kind", "bounced").stdout)
    assert len(listed) == 4 and {r["source"] for r in listed} == {"mail"}
    table = run(env, "feedback", "list", "--tenant", str(tenant)).stdout.decode()
    assert "delivered" in table and "u0@example.com" in table


def test_a_message_an_mta_pipes_with_its_from_line_is_one_message(worker_env, engine, tenant,
                                                                 look, return_path):
    """Exim's pipe transport (by default) and Postfix's (flag F) write an mbox From_ line
    before the message and quote none of its own lines: a returned message's line that
    starts with "From ", even with a date (a quoted reply's), is still the same message,
    and an mbox's messages are still told apart by their From_ lines."""
    env = with_bounce_domain(worker_env)
    logs = sent_rows(engine, tenant, 3)

    def bounce(i, from_line):
        verp = return_path.address(logs[i]["id"])
        raw = bounce_mail("postfix_bounce.eml", verp=verp, message_id=logs[i]["message_id"],
                          recipient=f"u{i}@example.com").replace(b"\r\n", b"\n").replace(
            b"Hello Ann, welcome aboard.\n",
            b"Hello Ann, welcome aboard.\n\nFrom the whole team at Acme\n"
            b"\nFrom bob Mon Jan  5 12:00:00 2026 wrote:\n> see you\n")
        return from_line + b"\n" + raw + b"\n"

    # As Exim 4.96 pipes it with `envelope_to_add` (docs/operations.md): the recipient is
    # in Envelope-to, not on the command line, where Exim refuses a tainted $local_part.
    verp = return_path.address(logs[0]["id"]).encode()
    exim = bounce(0, b"From MAILER-DAEMON Sun Dec 06 00:33:36 2026\nEnvelope-to: " + verp)
    assert run(env, "feedback", "ingest", "-", stdin=exim).stdout.decode().count(
        "matched by verp") == 1
    # As Postfix's pipe writes its From_ line with flag F, two messages in one mbox.
    mbox = bounce(1, b"From MAILER-DAEMON  Sun Dec  6 00:33:36 2026") + \
        bounce(2, b"From MAILER-DAEMON  Sun Dec  6 00:33:37 2026")
    assert run(env, "feedback", "ingest", "-", stdin=mbox).stdout.decode().count(
        "matched by verp") == 2
    assert sorted((r["kind"], r["recipient"]) for r in look.feedback()) == [
        ("bounced", f"u{i}@example.com") for i in range(3)]


def test_mark_seen_reads_each_maildir_message_once(worker_env, engine, tenant, look,
                                                   return_path, tmp_path):
    """A cron job over the Maildir a fetcher fills reads only what it has not read: each
    message recorded moves to cur/ flagged seen, as a mail reader marks it, and is skipped
    afterwards. A message flagged otherwise but not seen is read; one seen is not."""
    env = with_bounce_domain(worker_env)
    logs = sent_rows(engine, tenant, 4)

    def mail(i, flags=""):
        message = mailbox.MaildirMessage(bounce_mail(
            "postfix_bounce.eml", verp=return_path.address(logs[i]["id"]),
            message_id=logs[i]["message_id"], recipient=f"u{i}@example.com"))
        if flags:
            message.set_subdir("cur")
            message.set_flags(flags)
        return message

    path = tmp_path / "Maildir"
    folder = mailbox.Maildir(str(path), create=True)
    fresh, flagged, seen = folder.add(mail(0)), folder.add(mail(1, "F")), folder.add(mail(2, "S"))
    out = run(env, "feedback", "ingest", "--mark-seen", str(path)).stdout.decode()
    assert out.count("matched by verp") == 2 and fresh in out and flagged in out
    assert os.listdir(path / "new") == []
    assert sorted(os.listdir(path / "cur")) == sorted(
        [f"{fresh}:2,S", f"{flagged}:2,FS", f"{seen}:2,S"])

    later = folder.add(mail(3))
    out = run(env, "feedback", "ingest", "--mark-seen", str(path)).stdout.decode()
    assert out.count("matched by verp") == 1 and later in out and fresh not in out
    assert sorted(r["recipient"] for r in look.feedback()) == [
        "u0@example.com", "u1@example.com", "u3@example.com"]
    # Without the option the whole folder is read, and what was recorded stays as it was.
    out = run(env, "feedback", "ingest", str(path)).stdout.decode()
    assert out.count("already recorded") == 3 and out.count("matched by verp") == 1
    assert len(os.listdir(path / "cur")) == 4


def test_mark_seen_leaves_a_message_unseen_when_it_was_not_recorded(worker_env, server_url,
                                                                   tmp_path):
    folder = mailbox.Maildir(str(tmp_path / "Maildir"), create=True)
    key = folder.add(bounce_mail("postfix_bounce.eml", verp=f"bounce-x@{BOUNCE_DOMAIN}",
                                 message_id="<m@example.com>"))
    with throwaway_database(server_url) as url:  # not migrated: the insert fails
        done = run({**worker_env, "POSTRELAY_DATABASE_URL": url}, "feedback", "ingest",
                   "--mark-seen", str(tmp_path / "Maildir"), ok=False)
    assert done.returncode == 75, done.stderr.decode()
    assert os.listdir(tmp_path / "Maildir" / "new") == [key]


def test_ingest_refuses_a_missing_file_and_lists_the_unmatched(worker_env, look, tmp_path):
    done = run(worker_env, "feedback", "ingest", str(tmp_path / "nope.eml"), ok=False)
    assert done.returncode == 1 and b"FILE" in done.stderr and b"does not exist" in done.stderr
    stray = tmp_path / "stray.eml"
    stray.write_bytes(b"From: someone@example.org\r\nSubject: hello\r\n\r\nhi there\r\n")
    (tmp_path / "folder").mkdir()  # not a Maildir: refused before the file before it is read
    done = run(worker_env, "feedback", "ingest", str(stray), str(tmp_path / "folder"), ok=False)
    assert done.returncode == 1 and b"not a Maildir" in done.stderr
    assert look.feedback() == []
    run(worker_env, "feedback", "ingest", str(stray))
    (row,) = json.loads(run(worker_env, "feedback", "list", "--unmatched", "--json").stdout)
    assert row["kind"] == "unparsed" and row["email_log_id"] is None
    bad = run(worker_env, "feedback", "list", "--kind", "exploded", ok=False)
    assert bad.returncode == 1 and b"kind" in bad.stderr


def test_stdin_twice_or_closed_and_a_path_it_cannot_follow_are_refused_before_any_is_read(
        worker_env, look, tmp_path):
    """`- -` read the message once and then "empty, no message to record", exit 0; a
    symbolic link loop was said not to exist. Each is now refused by name, the good file
    before it unread."""
    stray = tmp_path / "stray.eml"
    stray.write_bytes(b"From: someone@example.org\r\nSubject: hello\r\n\r\nhi there\r\n")
    done = run(worker_env, "feedback", "ingest", str(stray), "-", "-", stdin=b"hello",
               ok=False)
    assert done.returncode == 1 and done.stdout == b"", done.stdout
    assert done.stderr == b"error: FILE: - (stdin) given more than once: stdin is read once\n"
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    done = run(worker_env, "feedback", "ingest", str(stray), str(loop), ok=False)
    assert done.returncode == 1 and done.stdout == b"", done.stdout
    assert done.stderr.decode() == f"error: FILE: {loop}: Too many levels of symbolic links\n"
    # A closed stdin (`<&-`) was "unexpected AttributeError: 'NoneType' object has no
    # attribute 'buffer'".
    done = subprocess.run([str(POSTRELAY), "feedback", "ingest", str(stray), "-"],
                          env=worker_env, capture_output=True,
                          preexec_fn=lambda: os.close(0), timeout=60)
    assert done.returncode == 1 and done.stdout == b"", done.stdout
    assert done.stderr == b"error: FILE: - (stdin) given, but stdin is closed\n"
    assert look.feedback() == []


UNREADABLE = "permission denied (not readable by this user)"
UNMOVABLE = "permission denied (--mark-seen moves the messages it records, and this user may not)"


@pytest.mark.parametrize("case", ["file", "maildir", "mark-seen"])
def test_a_path_it_may_not_read_is_refused_before_any_is_recorded(worker_env, look, case):
    """The file before it was recorded, then "Permission denied" and exit 1: a failed run
    that had recorded. It is now refused with the other checks, before any is read; for a
    Maildir, the folders its messages are listed from too, and with --mark-seen, moved
    between."""
    # The modes deny the files' owner. Root reads everything through its capabilities, so
    # as root the command runs without the two that override file modes: a user other than
    # root could not run the interpreter where it lies under /root.
    folder = Path(tempfile.mkdtemp())
    try:
        readable = folder / "readable.eml"
        readable.write_bytes(b"From: someone@example.org\r\nSubject: hi\r\n\r\nhi\r\n")
        options, rule = ["--mark-seen"] if case == "mark-seen" else [], UNREADABLE
        if case == "file":
            given = secret = folder / "secret.eml"
            secret.write_bytes(b"From: someone@example.org\r\n\r\nhush\r\n")
            secret.chmod(0o000)
        else:  # new/ its owner may not list, or (--mark-seen) list but not change
            given = folder / "Maildir"
            mailbox.Maildir(str(given), create=True).add(b"From: a@example.org\r\n\r\nhi\r\n")
            if case == "maildir":
                (given / "new").chmod(0o300)
            else:
                rule = UNMOVABLE
                for sub in ("cur", "new"):
                    (given / sub).chmod(0o555)
            secret = given / "new"
        as_owner = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
                    "--inh-caps", "-all"] if os.geteuid() == 0 else []
        done = subprocess.run([*as_owner, str(POSTRELAY), "feedback", "ingest", *options,
                               str(readable), str(given)], env=worker_env,
                              capture_output=True, timeout=60)
        assert done.returncode == 1 and done.stdout == b"", done.stdout
        assert done.stderr.decode() == f"error: FILE: {secret}: {rule}\n"
        assert look.feedback() == []
    finally:
        for sub in ("Maildir/cur", "Maildir/new"):
            if (folder / sub).exists():
                (folder / sub).chmod(0o755)  # for the removal, when not run as root
        shutil.rmtree(folder)

def test_empty_input_is_no_message_and_records_nothing(worker_env, look, tmp_path):
    """An empty file, an mbox emptied after it was read (a spool a cron job reads), an mbox
    holding only a From_ line and nothing on stdin each recorded an `unparsed` report of
    no bytes, and every later one was taken for it ("already recorded")."""
    (tmp_path / "empty.eml").write_bytes(b"")
    (tmp_path / "blank.eml").write_bytes(b"\r\n\n")
    (tmp_path / "only.mbox").write_bytes(b"From MAILER-DAEMON Sun Dec  6 00:33:36 2026\n")
    folder = mailbox.Maildir(str(tmp_path / "Maildir"), create=True)
    key = folder.add(b"")
    out = run(worker_env, "feedback", "ingest", "--mark-seen", str(tmp_path / "empty.eml"),
              str(tmp_path / "blank.eml"), str(tmp_path / "only.mbox"),
              str(tmp_path / "Maildir")).stdout.decode().splitlines()
    assert out == [f"{tmp_path / 'empty.eml'}: empty, no message to record",
                   f"{tmp_path / 'blank.eml'}: empty, no message to record",
                   f"{tmp_path / 'only.mbox'}#1: empty, no message to record",
                   f"{tmp_path / 'Maildir'}:{key}: empty, no message to record"]
    assert os.listdir(tmp_path / "Maildir" / "cur") == [f"{key}:2,S"]  # read: not again
    done = run(worker_env, "feedback", "ingest", "-", stdin=b"")
    assert done.stdout == b"stdin: empty, no message to record\n"
    assert look.feedback() == []


def test_ingest_asks_to_be_tried_again_when_the_database_fails(worker_env, server_url):
    """Exit 75 (EX_TEMPFAIL) and one line, whether the database cannot be reached or is not
    migrated: a pipe transport (Postfix's, Exim's) keeps the message and retries on that
    code alone. On any other code Postfix returns the message to its sender, and a bounce,
    whose sender is empty, is then dropped."""
    raw = bounce_mail("postfix_bounce.eml", verp=f"bounce-x@{BOUNCE_DOMAIN}",
                      message_id="<m@example.com>")
    unreachable = {**worker_env, "POSTRELAY_DATABASE_URL":
                   "postgresql://u:s3cret@127.0.0.1:1/nope"}
    with throwaway_database(server_url) as url:
        unmigrated = {**worker_env, "POSTRELAY_DATABASE_URL": url}
        lines = []
        for env in (unreachable, unmigrated):
            done = run(env, "feedback", "ingest", "--to", f"bounce-x@{BOUNCE_DOMAIN}", "-",
                       stdin=raw, ok=False)
            assert done.returncode == 75, done.stderr.decode()
            assert done.stdout == b"" and b"Traceback" not in done.stderr
            (line,) = done.stderr.decode().splitlines()
            lines.append(line)
    assert lines[0].startswith("error: cannot reach the database") and "s3cret" not in lines[0]
    assert "aa_email" in lines[1] and "postrelay migrate" in lines[1]
    # So does a bad setting: the MTA keeps the bounce while it is put right.
    bad = {**worker_env, "POSTRELAY_EMAIL_BOUNCE_DOMAIN": BOUNCE_DOMAIN,
           "POSTRELAY_FEEDBACK_SECRET": "short"}
    done = run(bad, "feedback", "ingest", "-", stdin=raw, ok=False)
    assert done.returncode == 75 and b"POSTRELAY_FEEDBACK_SECRET" in done.stderr


def test_the_same_message_is_recorded_once_whatever_line_ends_it_came_with(
        worker_env, engine, tenant, look, return_path, tmp_path):
    """A report without a Message-ID is known by its bytes: the same soft bounce as a file,
    as a CRLF copy and in an mbox (a blank line after it) made three rows, and the third
    suppressed the address."""
    env = with_bounce_domain(worker_env)
    (log,) = sent_rows(engine, tenant, 1)
    lines = bounce_mail("postfix_bounce.eml", verp=return_path.address(log["id"]),
                        message_id=log["message_id"], recipient="u0@example.com").replace(
        b"5.1.1", b"4.2.2").split(b"\r\n")
    # Without the report's own Message-Id (the returned message's Message-ID stays).
    crlf = b"\r\n".join(line for line in lines if not line.startswith(b"Message-Id:"))
    lf = crlf.replace(b"\r\n", b"\n")
    (tmp_path / "lf.eml").write_bytes(lf)
    (tmp_path / "crlf.eml").write_bytes(crlf)
    (tmp_path / "one.mbox").write_bytes(b"From MAILER-DAEMON Sun Dec  6 00:33:36 2026\n" + lf +
                                        b"\n\n")
    out = run(env, "feedback", "ingest", str(tmp_path / "lf.eml"), str(tmp_path / "crlf.eml"),
              str(tmp_path / "one.mbox")).stdout.decode()
    assert out.count("already recorded") == 2
    assert [r["kind"] for r in look.feedback()] == ["soft-bounced"]
    assert look.suppressed(tenant) == {}


def test_the_email_log_shows_late_bounces_and_why_an_address_is_suppressed(
        worker_env, engine, tenant, look, return_path, tmp_path):
    env = {**worker_env, "POSTRELAY_EMAIL_BOUNCE_DOMAIN": BOUNCE_DOMAIN,
           "POSTRELAY_FEEDBACK_SECRET": SECRET.decode()}
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
        other = insert_log(conn, tenant_id=tenant, recipients=("bob@example.com",))
    bounce = tmp_path / "bounce.eml"
    bounce.write_bytes(bounce_mail("postfix_bounce.eml", verp=return_path.address(sent["id"]),
                                   message_id=sent["message_id"]))
    run(env, "feedback", "ingest", str(bounce))

    bounced = json.loads(run(env, "emails", "--status", "bounced", "--json").stdout)
    assert [r["id"] for r in bounced] == [str(sent["id"])]
    assert bounced[0]["status"] == "sent" and bounced[0]["delivery"] == "bounced"
    assert str(other["id"]) not in run(env, "emails", "--status", "bounced").stdout.decode()
    listing = run(env, "emails").stdout.decode()
    assert "sent → bounced" in listing
    story = run(env, "emails", "show", str(sent["id"])).stdout.decode()
    assert "feedback:" in story and "bounced" in story and "5.1.1" in story
    assert "suppressed" in story
    (row,) = json.loads(run(env, "emails", "suppressed", "--json").stdout)
    assert (row["address"], row["source"], row["category"]) == ("ann@example.com", "mail", "")
    table = run(env, "emails", "suppressed").stdout.decode()
    assert "mail" in table and "(all)" in table and "5.1.1" in table


async def test_postrelay_inbound_as_a_process_records_a_bounce_and_stops_on_sigterm(
        worker_env, engine, tenant, look, return_path):
    import signal
    import socket

    import aiosmtplib

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**worker_env, "POSTRELAY_EMAIL_BOUNCE_DOMAIN": BOUNCE_DOMAIN,
           "POSTRELAY_FEEDBACK_SECRET": SECRET.decode()}
    missing = run(worker_env, "inbound", "--port", str(port), ok=False)
    assert missing.returncode == 2 and b"POSTRELAY_EMAIL_BOUNCE_DOMAIN" in missing.stderr
    with engine.begin() as conn:
        sent = insert_log(conn, tenant_id=tenant)
    verp = return_path.address(sent["id"])
    server = subprocess.Popen([str(POSTRELAY), "inbound", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        await until_listening(port)
        smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=5)
        await smtp.connect()
        await smtp.sendmail("", [verp], bounce_mail("postfix_bounce.eml", verp=verp,
                                                    message_id=sent["message_id"]))
        await smtp.quit()
        await await_inbox_empty(engine)  # the 250 said stored; recorded right after
    finally:
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=30)
    assert server.returncode == 0, err.decode()
    assert b"bounces.acme.example" in out
    assert look.log(sent["id"])["delivery"] == "bounced"
