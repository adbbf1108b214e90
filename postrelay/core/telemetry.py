"""One helper for structured events named `postrelay.<component>.<action>`.

Fields travel in `extra` (not in the message) so that log processors and metrics can
pick them up by name.
"""

import logging
from typing import Any

_logger = logging.getLogger("postrelay")


def event(name: str, level: int = logging.INFO, /, **fields: Any) -> None:
    """Emit `name` with structured `fields`; `name` is the dotted event name."""
    if _logger.isEnabledFor(level):
        detail = " ".join(f"{k}={v}" for k, v in fields.items())
        _logger.log(level, "%s %s", name, detail, extra={"event": name, **fields})


def configure_logging(level: str = "INFO") -> None:
    """postrelay's events at `level`; other libraries' (pgserver, alembic) only from WARNING."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", force=True
    )
    _logger.setLevel(level.upper())
