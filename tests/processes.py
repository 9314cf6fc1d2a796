"""Real processes for tests: the project's commands, a Celery worker and daphne, each in a
session of its own with its output in a file, pointed at this run's Redis and test database."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from django.db import connection

BASE_DIR = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def wait_for(predicate, *, timeout: float = 20, interval: float = 0.02, message: str = "condition"):
    """Poll until predicate() is truthy and return its value; fail after the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def process_env(**extra: str) -> dict:
    """This run's settings, Redis and test database, for a process the tests start."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.test",
        REDIS_URL=os.environ["REDIS_URL"],
        TEST_DATABASE_NAME=str(connection.settings_dict["NAME"]),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


class Process:
    """One command in a session of its own (signals reach its children too), logging to a file."""

    ready_text: str | None = None  # a line in the log that says it is ready

    def __init__(self, *command: str, name: str = "process", **env: str):
        self.command = command
        self.name = name
        self.env = env
        self.log_path = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> "Process":
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command, cwd=BASE_DIR, env=process_env(**self.env), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if self.ready_text:
            wait_for(lambda: self.process.poll() is not None or self.ready_text in self.log(), timeout=timeout,
                     message=f"{self.name} to start")
            assert self.process.poll() is None, f"{self.name} exited:\n{self.log()}"
        return self

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL the whole session, as a crash: nothing gets to clean up."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM, then SIGKILL if it does not stop in time (SIGCONT first, if it was stopped)."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGCONT)
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        except ProcessLookupError:
            pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class Manage(Process):
    """`python manage.py <args>`."""

    def __init__(self, *args: str, **env: str):
        super().__init__(sys.executable, "manage.py", *args, name=args[0] if args else "manage", **env)


class Worker(Process):
    """A Celery prefork worker."""

    ready_text = " ready."

    def __init__(self, name: str = "worker", concurrency: int = 1, **env: str):
        super().__init__(
            str(BIN / "celery"), "-A", "config", "worker", "-P", "prefork", "-c", str(concurrency),
            "--loglevel", "INFO", "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
            name=name, **env,
        )


class Daphne(Process):
    """daphne serving config.asgi on 127.0.0.1:<port>."""

    ready_text = "Listening on TCP address"

    def __init__(self, port: int, **env: str):
        super().__init__(str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "config.asgi:application",
                         name="daphne", **env)
        self.url = f"http://127.0.0.1:{port}"
