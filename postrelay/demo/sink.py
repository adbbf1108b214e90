"""The demo's embedded SMTP sink: keeps what it receives in a Maildir and refuses the
demo's two bad mailboxes the way real servers do."""

from pathlib import Path

from postrelay.demo.emails import BLOCKED, MISSING
from postrelay.testing import ScriptedHandler, reply


def demo_sink_handler(maildir: Path) -> ScriptedHandler:
    return ScriptedHandler({
        MISSING.format(tenant="*"): reply("550 5.1.1 No such user here"),
        BLOCKED: reply("554 5.7.1 Message rejected by the recipient's policy"),
    }, maildir=maildir)
