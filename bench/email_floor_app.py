"""The email benchmark's floor: `reindex` jobs whose handler only hands one prebuilt message
to an SmtpPool — the queue and the SMTP exchange, without rendering, addresses, MIME or the
email log. What the full path costs beyond this is the email layer's own work."""

import os
from email.message import EmailMessage

from postrelay.orchestrator import SmtpConfig, SmtpPool
from postrelay.queue import Job, handler

_MESSAGE = EmailMessage()
_MESSAGE["From"] = "bench@postrelay.example"
_MESSAGE["To"] = "user@example.com"
_MESSAGE["Subject"] = "Welcome"
_MESSAGE.set_content("Hello, welcome aboard.\n")
DATA = _MESSAGE.as_bytes()
_pool: SmtpPool | None = None


@handler("reindex")
async def send(job: Job) -> None:
    global _pool
    if _pool is None:
        _pool = SmtpPool(SmtpConfig(host="127.0.0.1", port=int(os.environ["POSTRELAY_SMTP_PORT"]),
                                    pool_size=10))
    await _pool.send("bench@postrelay.example", [f"user{job.payload['n']}@example.com"], DATA)
