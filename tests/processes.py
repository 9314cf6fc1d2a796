"""Real processes for tests: the project's commands, a Celery worker and the web server, each in a
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

    def start(self, timeout: float = 30) -> Process:
        """Start (or start again: the log goes on, so it waits for one more ready line)."""
        seen = self.log().count(self.ready_text) if self.ready_text else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                cwd=BASE_DIR,
                env=process_env(**self.env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if self.ready_text:
            wait_for(
                lambda: self.process.poll() is not None or self.log().count(self.ready_text) > seen,
                timeout=timeout,
                message=f"{self.name} to start",
            )
            assert self.process.poll() is None, f"{self.name} exited:\n{self.log()}"
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        assert self.process is not None, "not started"
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        assert self.process is not None, "not started"
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
        self.args = args


def run_command(*args: str, timeout: float = 60, **env: str) -> tuple[int, str]:
    """`python manage.py <args>` to its end: (exit code, output). Killed, and its log removed, after."""
    command = Manage(*args, **env).start()
    try:
        return command.wait(timeout), command.log()
    finally:
        command.kill()
        command.log_path.unlink(missing_ok=True)


class Worker(Process):
    """A Celery prefork worker."""

    ready_text = " ready."

    def __init__(self, name: str = "worker", concurrency: int = 1, **env: str):
        super().__init__(
            str(BIN / "celery"),
            "-A",
            "config",
            "worker",
            "-P",
            "prefork",
            "-c",
            str(concurrency),
            "--loglevel",
            "INFO",
            "-n",
            f"{name}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            name=name,
            **env,
        )

    def received(self, task_id, task: str = "eventbus.run_job") -> int:
        """How many times the worker logged receiving this task."""
        return self.log().count(f"Task {task}[{task_id}] received")

    def pool_pids(self) -> list[int]:
        """The prefork pool's processes: the worker's children."""
        return child_pids(self.pid)


class Web(Process):
    """The gateway's server serving config.asgi on 127.0.0.1:<port>, as the Procfile runs it
    (uvicorn, gateway.uvicorn's protocol, no per-message deflate)."""

    ready_text = "Uvicorn running on"

    def __init__(self, port: int, **env: str):
        super().__init__(
            str(BIN / "uvicorn"),
            "config.asgi:application",
            *("--host", "127.0.0.1", "--port", str(port)),
            *("--ws", "gateway.uvicorn:WebSocketProtocol", "--ws-per-message-deflate", "false"),
            *("--lifespan", "off"),
            name="web",
            **env,
        )
        self.url = f"http://127.0.0.1:{port}"


# Added for the end-to-end harness (tests/e2e): helpers around the classes above.


def child_pids(pid: int) -> list[int]:
    """The direct children of a process (a Celery worker's prefork pool), from /proc."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def alive(process: Process) -> bool:
    """Started and not exited."""
    return process.process is not None and process.process.poll() is None


def restart(process: Process, timeout: float = 30) -> Process:
    """Start a process again after it exited or was killed."""
    if alive(process):
        raise RuntimeError(f"{process.name} is still running")
    return process.start(timeout=timeout)


# Added for the stack's test (tests/test_stack.py).


def pids_with_env(name: str, value: str) -> list[int]:
    """This user's processes whose environment has name=value: everything a process started with a
    unique value (RUN_DIR) started in turn, in whatever session, found to clean up."""
    wanted = f"{name}={value}".encode()
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if wanted in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
        except (OSError, ValueError):
            continue
    return [pid for pid in pids if pid != os.getpid()]


def pids_working_in(directory: str | Path) -> list[int]:
    """This user's processes whose working directory is in `directory`: a redis-server started with
    `--dir` there, whose environment pids_with_env cannot read (its process title overwrites it)."""
    prefix = str(directory)
    pids = []
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            if os.readlink(cwd).startswith(prefix):
                pids.append(int(cwd.parent.name))
        except (OSError, ValueError):
            continue
    return [pid for pid in pids if pid != os.getpid()]
