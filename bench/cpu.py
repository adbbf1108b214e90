"""CPU time the processes of a benchmark run spend, read with psutil: where a figure's
budget went (the process under test, the SMTP sink, the database server), and so how far
two cores can take it.

    meter = CpuMeter({"worker": worker_pid, "sink": sink_pid})
    meter.start()
    ...                       # the timed run
    spent = meter.stop()      # {"worker": 1.9, "sink": 0.7, "postgres": 1.1} in CPU seconds

"postgres" is the server the run uses when it runs on this machine: its postmaster and every
process under it (backends, WAL writer, checkpointer, ...), found from a backend's pid. Other
servers on the machine, and other clients' test runs on another server, are not counted; other
clients of the same server are, so measure on a server of its own. Counted from the moment
`start` is called: a backend that exits before `stop` takes its time with it, so the figure is
a lower bound. Without a server pid, every process named `postgres` is counted.
"""

from __future__ import annotations

import psutil

SERVER = "postgres"


class CpuMeter:
    def __init__(self, processes: dict[str, int], *, server_backend: int | None = None,
                 server: bool = True) -> None:
        self._processes = {name: psutil.Process(pid) for name, pid in processes.items()}
        self._postmaster = _postmaster(server_backend) if server_backend else None
        self._count_server = server  # False: a run that uses no database
        self._before: dict[str, float] = {}
        self._server_before: dict[int, float] = {}

    def start(self) -> None:
        self._before = {name: process_cpu(p) for name, p in self._processes.items()}
        if self._count_server:
            self._server_before = {p.pid: process_cpu(p) for p in self._server_processes()}

    def stop(self) -> dict[str, float]:
        spent = {name: process_cpu(p) - self._before[name] for name, p in self._processes.items()}
        if not self._count_server:
            return spent
        # A backend that started during the run counts from zero; one that exited is gone.
        spent[SERVER] = sum(max(0.0, process_cpu(p) - self._server_before.get(p.pid, 0.0))
                            for p in self._server_processes())
        return spent

    def _server_processes(self) -> list[psutil.Process]:
        if self._postmaster is None:
            return [p for p in psutil.process_iter(["name"]) if p.info["name"] == SERVER]
        try:
            return [self._postmaster, *self._postmaster.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def _postmaster(backend: int) -> psutil.Process | None:
    """The server process above one of its backends; None when it is not on this machine."""
    try:
        process = psutil.Process(backend)
        return process.parent() if process.name() == SERVER else None
    except psutil.NoSuchProcess:
        return None


def process_cpu(process: psutil.Process) -> float:
    """User + system CPU seconds of a process; 0 once it is gone."""
    try:
        times = process.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return times.user + times.system
