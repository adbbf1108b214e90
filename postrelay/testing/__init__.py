"""What tests of postrelay, and of applications built on it, use: a real SMTP server that
answers by script (`SmtpSink`, `ScriptedHandler`). Not part of the product: no module of
postrelay imports this package but the demo, which runs its embedded mail server on it.

    from postrelay.testing import ScriptedHandler, SmtpSink, reply

    with SmtpSink(ScriptedHandler({"nobody@*": reply("550 5.1.1 No such user")})) as sink:
        ...  # send to sink.host:sink.port
"""

from postrelay.testing.sink import (
    Behaviour,
    Received,
    Refusal,
    ScriptedHandler,
    SmtpSink,
    accept,
    drop_after_data,
    reply,
    reply_at_data,
    slow,
)

__all__ = [
    "Behaviour",
    "Received",
    "Refusal",
    "ScriptedHandler",
    "SmtpSink",
    "accept",
    "drop_after_data",
    "reply",
    "reply_at_data",
    "slow",
]
