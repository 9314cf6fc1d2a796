"""The benchmarks' processes: tests/processes.py's `Process` (one command in a session of its own,
its output in a log file, paused, resumed and stopped with what its session left behind) and its
/proc readers, the one wrapper of the repository, plus the little only the benchmarks need: a
check for their own packages, SIGTERM as Ctrl-C, and waiting for a server's port."""

from __future__ import annotations

import importlib.util
import socket
import time

from tests.processes import Process, child_pids, cpu_seconds, proc_stat, session_pids, wait_for

__all__ = [
    "Process",
    "child_pids",
    "cpu_seconds",
    "importable",
    "interrupted",
    "port_open",
    "proc_stat",
    "session_pids",
    "wait_for",
    "wait_port",
]


def importable(module: str) -> bool:
    """Whether a benchmark's own package is installed (bench/requirements.txt)."""
    return importlib.util.find_spec(module) is not None


def interrupted(signum, frame):
    """SIGTERM as Ctrl-C: the benchmark's finally blocks stop its processes and drop its databases."""
    raise KeyboardInterrupt


def port_open(port: int) -> bool:
    """Something accepts connections on 127.0.0.1:<port>."""
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        return True
    except OSError:
        return False


def wait_port(process: Process, port: int, timeout: float = 60, what: str | None = None) -> None:
    """Until the process's server accepts connections on the port; an error, with its log, if it
    exits or the timeout passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.alive():
        if port_open(port):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what or process.name} did not start:\n{process.log(tail=3000)}")
