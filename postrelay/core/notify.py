"""At most one NOTIFY per transaction and channel.

Every NOTIFY takes a global lock when its transaction commits, which serialises heavy
writers, and a wake-up needs to be sent only once anyway. Writers ask `needed()` before
choosing the statement that carries the NOTIFY, and `mark()` after it ran.

A NOTIFY sent inside a savepoint is discarded when the savepoint rolls back, so the mark is
the innermost savepoint's (or the transaction's): a write after such a rollback notifies
again, and a write inside a savepoint of a transaction that has notified does not.
"""

from __future__ import annotations

import weakref

from postrelay.core.dbcall import AnyConnection, execution_option, open_transactions


class NotifyOnce:
    def __init__(self, channel: str) -> None:
        self.channel = channel
        # Weak: a finished transaction or savepoint drops out by itself.
        self._sent: weakref.WeakSet[object] = weakref.WeakSet()

    def wanted(self, conn: AnyConnection, notify: bool) -> bool:
        """Whether the caller wants wake-ups at all: per call, or switched off for a whole
        engine with `engine.execution_options(postrelay_notify=False)` (poolers)."""
        return notify and bool(execution_option(conn, "postrelay_notify", True))

    def needed(self, conn: AnyConnection) -> bool:
        return not any(txn in self._sent for txn in open_transactions(conn))

    def mark(self, conn: AnyConnection) -> None:
        open_now = open_transactions(conn)
        if open_now:
            self._sent.add(open_now[0])
