"""Handlers for the pickup-latency benchmark: `postrelay worker --app bench.latency_app`.

Each job's payload carries `t0`, the enqueuer's `time.time()` taken just before its commit.
The handler appends `time.time() - t0` (seconds, one float per line) to the file named by
BENCH_LATENCY_FILE, flushing each line so the benchmark can read it while the worker runs.
Both processes run on the same machine, so their wall clocks agree.
"""

import os
import time

from postrelay.queue import Job, handler

LATENCY_FILE_ENV = "BENCH_LATENCY_FILE"

_out = open(os.environ[LATENCY_FILE_ENV], "a", encoding="ascii")  # noqa: SIM115 - process-long


@handler("reindex")
async def record_pickup(job: Job) -> None:
    latency = time.time() - float(job.payload["t0"])
    _out.write(f"{latency:.6f}\n")
    _out.flush()
