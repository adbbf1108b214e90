"""Replies that are not the one a stage of a transaction is due, and what they make of it.

    raise not_positive(dialogue, reply, "data", refused, message_went=True)
    reply = await final_read(dialogue, "data", refused, stop)

And what the server lacks for a message, found before MAIL FROM (check_size,
needs_smtputf8).
"""

from __future__ import annotations

from collections.abc import Sequence

import aiosmtplib
from aiosmtplib import SMTPResponse

from postrelay.orchestrator.dialogue import Dialogue
from postrelay.orchestrator.replies import (
    Reply,
    SmtpAnswerLost,
    SmtpConfigError,
    SmtpError,
    SmtpPermanent,
    SmtpThrottled,
    SmtpTransient,
    Stage,
    classify,
    step,
)


def not_positive(dialogue: Dialogue, response: SMTPResponse, stage: Stage,
                 refused: dict[str, Reply] | None = None, *,
                 message_went: bool = False) -> SmtpError:
    """The error for a reply that is not the positive one due: a refusal (4xx, 5xx), or a
    reply that is no verdict (a 1xx or 3xx where a final reply is due, a 2xx to DATA, a
    code of no class). After one of those the dialogue is out of step and is closed; if it
    answered the message, the server may have taken it."""
    if 400 <= response.code < 600:
        return classify(aiosmtplib.SMTPResponseException(response.code, response.message),
                        stage, refused)
    dialogue.close()
    said = f"{stage}: the server answered {Reply.parse(response.code, response.message)}, " \
           "which is neither a success nor a refusal"
    if message_went:
        return SmtpAnswerLost(f"{said}, after the message was handed over: whether the "
                              "server accepted it is not known", stage=stage, refused=refused)
    return SmtpTransient(said, stage=stage, refused=refused)


async def final_read(dialogue: Dialogue, stage: Stage, refused: dict[str, Reply],
                     stop: SmtpError | None) -> SMTPResponse:
    """The next reply, once a recipient may have said 421 (`stop`) with the message sent as
    BDAT: a loss then (no reply, or none that could be read) is the close the 421
    announced, and the 421 is the answer (the server did not take the message)."""
    try:
        return await step(stage, dialogue.read(), refused)
    except SmtpTransient as exc:
        if isinstance(stop, SmtpThrottled) and stop.reply is not None and \
                stop.reply.code == 421 and exc.reply is None:
            raise stop from exc
        raise


def check_size(dialogue: Dialogue, message: bytes) -> None:
    """Refuse, before MAIL FROM, a message larger than the SIZE the server announced: it
    would read it all and refuse it (552), a refusal that reads as the recipients' when
    the message was at fault. RFC 1870 asks the client not to send it."""
    if dialogue.max_size is not None and len(message) > dialogue.max_size:
        raise SmtpConfigError(f"mail: the message is {len(message)} bytes, more than the "
                              f"{dialogue.max_size} the server takes (its SIZE): not sent",
                              stage="mail")


def needs_smtputf8(dialogue: Dialogue, sender: str, recipients: Sequence[str]) -> bool:
    """Whether MAIL FROM must ask for SMTPUTF8; refused when the server lacks it."""
    if sender.isascii() and all(r.isascii() for r in recipients):
        return False
    if not dialogue.smtputf8:
        raise SmtpPermanent("mail: non-ASCII addresses need SMTPUTF8, which the server lacks",
                            stage="mail")
    return True
