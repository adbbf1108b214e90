"""Debian's programs that tests start (pgbouncer, postfix), wherever they are installed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def find_program(name: str) -> str | None:
    """`name` on PATH, else in /usr/sbin (not on a non-root user's PATH), else None."""
    found = shutil.which(name)
    if found:
        return found
    debian = Path("/usr/sbin") / name
    return str(debian) if debian.is_file() and os.access(debian, os.X_OK) else None
