"""One helper for structured events named `postrelay.<component>.<action>`.

Fields travel in `extra` as `event` and `fields` (not only in the message) so that log
processors can pick them up by name. They are nested rather than spread into the record:
a field called `name` or `message` would otherwise clash with the LogRecord's own.
"""

import logging
from typing import Any

_logger = logging.getLogger("postrelay")


def event(name: str, level: int = logging.INFO, /, *, exc_info: BaseException | None = None,
          **fields: Any) -> None:
    """Emit `name` with structured `fields`; `name` is the dotted event name. With
    `exc_info`, the exception's traceback follows, for an error no one else logs."""
    if _logger.isEnabledFor(level):
        detail = " ".join(f"{k}={v}" for k, v in fields.items())
        _logger.log(level, "%s %s", name, detail, exc_info=exc_info,
                    extra={"event": name, "fields": fields})


def configure_logging(level: str = "INFO") -> None:
    """postrelay's events at `level`; other libraries' (pgserver, alembic) only from WARNING."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", force=True
    )
    _logger.setLevel(level.upper())
