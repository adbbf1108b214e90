"""A relay app for tests of the jobs-per-event cap: `list.blast` asks for `n` jobs."""

from postrelay.relay import Event, JobRequest, route


@route("list.blast", name="blast")
def blast(event: Event) -> list[JobRequest]:
    return [JobRequest("reindex", {"n": n}, key=str(n)) for n in range(event.payload["n"])]
