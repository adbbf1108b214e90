"""A new SMTP connection's greeting: EHLO, or HELO where the server does not know EHLO
(RFC 5321 4.1.1.1), and what a HELO session cannot do.

    refusal = await greet(smtp)          # None after EHLO; the server's refusal of it
    if refusal is not None:              # after HELO: no extension, so no STARTTLS or AUTH
        check_plain_session(security, username, refusal)
"""

from __future__ import annotations

import aiosmtplib

from postrelay.orchestrator.replies import Reply, SmtpConfigError, classify, step

# What a server that does not know EHLO answers it (command unrecognized, not implemented).
# Not 501 (a bad argument), 421 (closing) nor 550 or 554 (a refusal of the client), which
# HELO would meet as well.
EHLO_UNKNOWN = frozenset({500, 502})


async def greet(smtp: aiosmtplib.SMTP) -> Reply | None:
    """EHLO; or, where the server does not know it, HELO, and a session without extensions.
    Returns the server's refusal of EHLO then, None after an EHLO."""
    try:
        await smtp.ehlo()
        return None
    except aiosmtplib.SMTPHeloError as exc:
        if exc.code not in EHLO_UNKNOWN or not smtp.is_connected:
            raise classify(exc, "connect") from exc
        refusal = Reply.parse(exc.code, exc.message)
    except (aiosmtplib.SMTPException, OSError) as exc:
        raise classify(exc, "connect") from exc
    await step("connect", smtp.helo())
    return refusal


def check_plain_session(security: str, username: str | None, ehlo_refused: Reply) -> None:
    """A HELO session offers neither STARTTLS nor AUTH. Where the settings require one, the
    server cannot be used as they say: never in clear text, and never without the login
    the relay may need to take the mail; no retry changes that."""
    said = f"the server refused EHLO ({ehlo_refused}) and speaks only HELO, which offers"
    if security == "starttls":
        raise SmtpConfigError(
            f"tls: {said} no STARTTLS: POSTRELAY_SMTP_SECURITY=starttls cannot be met, and "
            "nothing is sent in clear text", stage="tls", reply=ehlo_refused)
    if username is not None:
        raise SmtpConfigError(
            f"auth: {said} no AUTH: POSTRELAY_SMTP_USERNAME is set, and the server cannot "
            "log it in", stage="auth", reply=ehlo_refused)
