"""Which kinds a worker serves: those it was asked for (all its registry's when none
were named), each with a handler, and each a value of the database's mdm.job_kind enum."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from postrelay.core.errors import ConfigError
from postrelay.core.telemetry import event


def registered_kinds(handled: Sequence[str], asked: Sequence[str] | None) -> tuple[str, ...]:
    """The kinds asked for (None: every handled kind); one with no handler is refused."""
    if asked is None:
        return tuple(handled)
    missing = [k for k in asked if k not in handled]
    if missing:
        # Quoted: an empty kind, or one with a trailing space, is otherwise invisible.
        raise ValueError(f"kinds: no handler registered for {', '.join(map(repr, missing))}")
    return tuple(asked)


def migrated_kinds(kinds: Sequence[str], known: set[str], *, asked: bool) -> tuple[str, ...]:
    """`kinds` less those the mdm.job_kind enum lacks, which would break every claim. A
    kind only handled is dropped with a warning; a kind the worker was asked for by name
    is refused: serving without it, the worker would idle while its jobs cannot even be
    enqueued, with a warning as the only word."""
    unknown = [k for k in kinds if k not in known]
    if unknown and asked:
        raise ConfigError(f"kinds: {', '.join(map(repr, unknown))} not in the database's "
                          "mdm.job_kind enum; add with `postrelay kinds add` and migrate")
    if unknown:
        event("postrelay.worker.unknown_kinds", logging.WARNING, kinds=",".join(unknown),
              hint="add them with `postrelay kinds add` and migrate")
    return tuple(k for k in kinds if k in known)
