"""What a long-running process built before it serves, set aside from the garbage collector.

    freeze_startup_heap()
    await service.start()

A worker, a relay, the inbound receiver or the API builds nearly everything it keeps
before it serves: the imported modules, the application, SQLAlchemy's and pydantic's
structures. Python's full collection walks every one of those objects each time, and it
runs every few thousand jobs or DSNs once enough objects have outlived the younger
generations: in a worker, a 50-70 ms stop of its event loop (every SMTP connection and
the claim loop wait) for a few objects found to be garbage. Frozen before the process
serves, those objects are left out of every later collection, so a full collection walks
only what was made since. Before, not after: the collection made first would otherwise
hold up the first claims or SMTP sessions.

What was frozen is kept for the process's life: a frozen object is never collected, even
if it later becomes part of a cycle nobody refers to. That costs little in a process that
keeps what it built, and is why only the commands that own a process call this, once,
never library code or the tests' own process.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect start-up's garbage first (it would be kept for good otherwise), then leave
    every object alive now out of later collections."""
    gc.collect()
    gc.freeze()
