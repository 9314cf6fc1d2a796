"""The bus's processes under one command (`manage.py run_jobs`): the Celery worker, run_router,
run_reclaimer, sweep_jobs and run_scheduler, started together, their output in one terminal,
each started again when it dies.

A process manager such as honcho stops every process when one exits; here a killed worker is
only started again (after 1 s, doubling up to 30 s while it keeps dying at once), so the others
go on and the job it held resumes once the sweep finds it. Each child runs in a process group
of its own: Ctrl-C reaches this supervisor alone, which sends each child one SIGTERM (their
clean stop) and waits; a second Ctrl-C kills them. On Linux a child also gets SIGTERM if the
supervisor itself dies.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

RESTART_MIN, RESTART_MAX = 1.0, 30.0
STABLE_AFTER = 60.0  # seconds a process must run before its next death restarts it after 1 s again
STOP_GRACE = 70.0  # the worker finishes its jobs in hand within its own 60 s


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    delay: float = RESTART_MIN
    restart_at: float | None = None
    readers: list[threading.Thread] = field(default_factory=list)


def _prctl():
    """Linux's prctl, looked up here rather than in a forked child (no lock taken there)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


PRCTL = _prctl()
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the supervisor dies."""
    if PRCTL is not None:
        PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


class Supervisor:
    """Starts `commands` ({name: argv}), prefixes each line they print with their name, starts
    again one that exits until stop() is called, then stops them all."""

    def __init__(self, commands: dict[str, list[str]], *, out=None, env: dict | None = None):
        self.children = [Child(name, argv) for name, argv in commands.items()]
        self.out = out or sys.stdout
        self.env = env
        self.width = max(len(name) for name in commands)
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def say(self, name: str, line: str) -> None:
        with self._lock:
            self.out.write(f"{name.ljust(self.width)} | {line}\n")
            self.out.flush()

    def start(self, child: Child) -> None:
        child.process = subprocess.Popen(
            child.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            process_group=0,  # Ctrl-C in the terminal reaches the supervisor, not each child
            preexec_fn=_die_with_parent if PRCTL is not None else None,
        )
        child.started_at, child.restart_at = time.monotonic(), None
        self.say(child.name, f"started (pid {child.process.pid}): {' '.join(child.argv[1:])}")
        reader = threading.Thread(target=self._relay, args=(child, child.process), daemon=True)
        reader.start()
        child.readers.append(reader)

    def _relay(self, child: Child, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            self.say(child.name, raw.decode(errors="replace").rstrip())

    def reap(self, child: Child) -> None:
        """A child that exited while running: say how, and schedule its start again."""
        assert child.process is not None
        code = child.process.returncode
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        if time.monotonic() - child.started_at > STABLE_AFTER:
            child.delay = RESTART_MIN
        self.say(child.name, f"exited ({how}); starting it again in {child.delay:.0f} s")
        child.process, child.restart_at = None, time.monotonic() + child.delay
        child.delay = min(child.delay * 2, RESTART_MAX)

    def run(self) -> None:
        for child in self.children:
            self.start(child)
        while not self._stop.wait(0.2):
            for child in self.children:
                if child.process is not None and child.process.poll() is not None:
                    self.reap(child)
                if child.process is None and child.restart_at and time.monotonic() >= child.restart_at:
                    self.start(child)
        self._stop_all()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self, *, force: bool = False) -> None:
        """Safe from a signal handler: the run loop stops the children."""
        if force:
            self._signal_all(signal.SIGKILL)
        self._stop.set()

    def _signal_all(self, signum: int) -> None:
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                try:
                    os.killpg(child.process.pid, signum)
                except ProcessLookupError:
                    pass

    def _stop_all(self) -> None:
        running = [c for c in self.children if c.process is not None and c.process.poll() is None]
        for child in running:
            self.say(child.name, "stopping (SIGTERM)")
        self._signal_all(signal.SIGTERM)
        until = time.monotonic() + STOP_GRACE
        for child in running:
            assert child.process is not None
            try:
                child.process.wait(max(0.1, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(child.name, f"still running after {STOP_GRACE:.0f} s: killed")
                os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait()
            self.say(child.name, f"stopped ({child.process.returncode})")
        for child in self.children:
            for reader in child.readers:
                reader.join(1)
