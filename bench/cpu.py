"""CPU time the processes of a benchmark run spend, read with psutil: where a figure's
budget went (the process under test, the SMTP sink, the database server), and so how far
two cores can take it.

    meter = CpuMeter({"worker": worker_pid, "sink": sink_pid})
    meter.start()
    ...                       # the timed run
    spent = meter.stop()      # {"worker": 1.9, "sink": 0.7, "postgres": 1.1} in CPU seconds

"postgres" is every process named `postgres` on this machine (the server the run uses when
it is local or embedded), counted from the moment `start` is called: a backend that exits
before `stop` takes its time with it, so the figure is a lower bound.
"""

from __future__ import annotations

import psutil

SERVER = "postgres"


class CpuMeter:
    def __init__(self, processes: dict[str, int]) -> None:
        self._processes = {name: psutil.Process(pid) for name, pid in processes.items()}
        self._before: dict[str, float] = {}
        self._server_before: dict[int, float] = {}

    def start(self) -> None:
        self._before = {name: process_cpu(p) for name, p in self._processes.items()}
        self._server_before = {p.pid: process_cpu(p) for p in _server_processes()}

    def stop(self) -> dict[str, float]:
        spent = {name: process_cpu(p) - self._before[name] for name, p in self._processes.items()}
        # A backend that started during the run counts from zero; one that exited is gone.
        spent[SERVER] = sum(max(0.0, process_cpu(p) - self._server_before.get(p.pid, 0.0))
                            for p in _server_processes())
        return spent


def _server_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == SERVER]


def process_cpu(process: psutil.Process) -> float:
    """User + system CPU seconds of a process; 0 once it is gone."""
    try:
        times = process.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return times.user + times.system
