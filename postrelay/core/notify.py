"""At most one NOTIFY per transaction and channel.

Every NOTIFY takes a global lock when its transaction commits, which serialises heavy
writers, and a wake-up needs to be sent only once anyway. Writers ask `needed()` before
choosing the statement that carries the NOTIFY, and `mark()` after it ran.
"""

from __future__ import annotations

import weakref

from postrelay.core.dbcall import AnyConnection, current_transaction, execution_option


class NotifyOnce:
    def __init__(self, channel: str) -> None:
        self.channel = channel
        # Weak: a finished transaction drops out by itself.
        self._sent: weakref.WeakSet[object] = weakref.WeakSet()

    def wanted(self, conn: AnyConnection, notify: bool) -> bool:
        """Whether the caller wants wake-ups at all: per call, or switched off for a whole
        engine with `engine.execution_options(postrelay_notify=False)` (poolers)."""
        return notify and bool(execution_option(conn, "postrelay_notify", True))

    def needed(self, conn: AnyConnection) -> bool:
        txn = current_transaction(conn)
        return txn is None or txn not in self._sent

    def mark(self, conn: AnyConnection) -> None:
        txn = current_transaction(conn)
        if txn is not None:
            self._sent.add(txn)
