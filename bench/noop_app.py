"""Handlers for the drain benchmark: `postrelay worker --app bench.noop_app`.

The handler does nothing, so what the benchmark measures is the queue's own cost per job:
claim, dispatch, bookkeeping and the completion write.
"""

from postrelay.queue import Job, handler


@handler("reindex")
async def noop(job: Job) -> None:
    return None
