"""The benchmarks' processes: each command in a session of its own (signals reach its children
too), its output in a log file, stopped with whatever its session left behind. bench/jobs.py and
bench/gateway.py start theirs with it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def importable(module: str) -> bool:
    """Whether a benchmark's own package is installed (bench/requirements.txt)."""
    import importlib.util

    return importlib.util.find_spec(module) is not None


def interrupted(signum, frame):
    """SIGTERM as Ctrl-C: the benchmark's finally blocks stop its processes and drop its databases."""
    raise KeyboardInterrupt


class Child:
    """One command in a session of its own (signals reach its children too), its output in a file."""

    def __init__(
        self, name: str, command: list[str], env: dict, log_dir: Path, ready_text: str | None = None
    ):
        self.name, self.command, self.env, self.ready_text = name, command, env, ready_text
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> Child:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self, tail: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def ready(self) -> bool:
        if not self.alive():
            raise RuntimeError(f"{self.name} exited:\n{self.log()}")
        return self.ready_text is None or self.ready_text in self.log(10**7)

    def signal_group(self, signum: int) -> None:
        if self.alive():
            try:
                os.killpg(self.pid, signum)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 20) -> None:
        """SIGCONT (it may be paused), SIGTERM to its session, SIGKILL if it does not stop in time."""
        if not self.alive():
            return
        assert self.process is not None
        try:
            os.killpg(self.pid, signal.SIGCONT)
            os.killpg(self.pid, signal.SIGTERM)
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        except ProcessLookupError:
            pass
        # What its session left behind (a Celery pool process), killed too.
        for pid in session_pids(self.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command (fields[0] is the state)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def session_pids(sid: int) -> list[int]:
    """The processes of a session (a child started with start_new_session: its sid is its pid)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = proc_stat(entry.name)
            if fields and int(fields[3]) == sid:
                found.append(int(entry.name))
    return found
