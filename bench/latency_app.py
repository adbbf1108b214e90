"""Handlers for the pickup-latency benchmark: `postrelay worker --app bench.latency_app`.

Each job's payload carries `seq`, its number in the benchmark's sequence. The handler
appends `seq time.time()` (one line per job, flushed at once so the benchmark can read it
while the worker runs) to the file named by BENCH_LATENCY_FILE; the benchmark, which took
the time each job's COMMIT began, subtracts. Both processes run on the same machine, so
their wall clocks agree.
"""

import os
import time

from postrelay.queue import Job, handler

LATENCY_FILE_ENV = "BENCH_LATENCY_FILE"

_out = open(os.environ[LATENCY_FILE_ENV], "a", encoding="ascii")  # noqa: SIM115 - process-long


@handler("reindex")
async def record_pickup(job: Job) -> None:
    _out.write(f"{job.payload['seq']} {time.time():.6f}\n")
    _out.flush()
