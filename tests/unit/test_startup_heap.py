"""A worker's or relay's main loop leaves what was built before its service starts out of
later garbage collections (core/heap.py), and only that: what is made once it runs is
collected as before. Run in a process of its own, as the commands run it: a frozen object
stays frozen for the life of the process, which must not be the tests' own."""

from __future__ import annotations

import subprocess
import sys

PROCESS = """
import asyncio, gc, os, signal
from postrelay.runtime import run_until_signalled

class Probe:
    def __init__(self):
        self.built = [[]]  # a list is always tracked by the collector

    async def start(self):
        self.started = [[]]
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)

    async def stop(self):
        collected = {id(o) for o in gc.get_objects()}  # every generation but the frozen
        print(id(self.built) in collected, id(self.started) in collected)

asyncio.run(run_until_signalled(Probe()))
"""


def test_what_was_built_before_the_service_starts_is_frozen_and_what_it_makes_is_not() -> None:
    done = subprocess.run([sys.executable, "-c", PROCESS], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.split() == ["False", "True"], done.stderr
