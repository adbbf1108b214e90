"""The relay's SQL, one home for the package: every statement of `sql/outbox.sql`, by name
(emit, the relay's claim and hand-off, ordering, retention, the operator's functions)."""

from __future__ import annotations

from postrelay.core.sqlfiles import load_queries

OUTBOX_SQL = load_queries("postrelay.relay", "sql/outbox.sql")
