"""Real processes for tests and benchmarks: the project's commands, a Celery worker and the web
server, each in a session of its own with its output in a file, pointed at this run's Redis and test
database (or, for bench/, at the environment a benchmark gives); and what /proc says of them (CPU
time, a session's or a parent's processes). The one process wrapper of the repository: bench/
starts its servers, workers, routers, publishers and profilers with `Process` too, so this module
imports nothing beyond Django and the standard library."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
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
    """One command in a session of its own (signals reach its children too), logging to a file.

    Its environment is `environ` (by default this test run's, process_env()) with `env` on top; its
    log a temporary file, or <log_dir>/<name>.log; `pipe=True` to read its stdout (stderr still goes
    to the log). The benchmarks give their own `environ` and `log_dir`."""

    ready_text: str | None = None  # a line in the log that says it is ready

    def __init__(
        self,
        *command: str,
        name: str = "process",
        env: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
        ready_text: str | None = None,
        pipe: bool = False,
        cwd: Path = BASE_DIR,
    ):
        self.command = command
        self.name = name
        self.environ = environ
        self.env = dict(env or {})
        self.cwd = cwd
        self.pipe = pipe
        if ready_text is not None:
            self.ready_text = ready_text
        if log_dir is None:
            self.log_path = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
        else:
            self.log_path = Path(log_dir) / f"{name}.log"
        self.process: subprocess.Popen | None = None
        self._ready_seen = 0

    def start(self, timeout: float = 30, *, wait: bool = True) -> Process:
        """Start (or start again: the log goes on, so it waits for one more ready line). With
        wait=False it returns at once: ready() says when it is."""
        self._ready_seen = self.log().count(self.ready_text) if self.ready_text else 0
        environ = process_env(**self.env) if self.environ is None else {**self.environ, **self.env}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env=environ,
                stdout=subprocess.PIPE if self.pipe else log,
                stderr=log if self.pipe else subprocess.STDOUT,
                start_new_session=True,
                text=self.pipe,
            )
        if self.ready_text and wait:
            wait_for(
                lambda: self.process.poll() is not None or self.ready_seen(),
                timeout=timeout,
                message=f"{self.name} to start",
            )
            assert self.process.poll() is None, f"{self.name} exited:\n{self.log()}"
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    @property
    def stdout(self):
        """Its output, a text stream (pipe=True)."""
        assert self.process is not None and self.process.stdout is not None, "not started with pipe=True"
        return self.process.stdout

    def alive(self) -> bool:
        """Started and not exited."""
        return self.process is not None and self.process.poll() is None

    def ready_seen(self) -> bool:
        """Its log has one more ready line than when it started (or it has no ready line)."""
        return self.ready_text is None or self.log().count(self.ready_text) > self._ready_seen

    def ready(self) -> bool:
        """Ready, as ready_seen(); an error if it exited meanwhile."""
        if not self.alive():
            raise RuntimeError(f"{self.name} exited:\n{self.log(tail=3000)}")
        return self.ready_seen()

    def log(self, tail: int | None = None) -> str:
        """Its log ("" before it has one), or the last `tail` characters of it."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text if tail is None else text[-tail:]

    def signal(self, signum: int) -> None:
        assert self.process is not None, "not started"
        self.process.send_signal(signum)

    def signal_group(self, signum: int) -> None:
        """A signal to its whole session (nothing if it has exited)."""
        if self.alive():
            try:
                os.killpg(self.pid, signum)
            except ProcessLookupError:
                pass

    def pause(self) -> None:
        """SIGSTOP to its session: it uses no CPU until resume()."""
        self.signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal_group(signal.SIGCONT)

    def wait(self, timeout: float = 30) -> int:
        assert self.process is not None, "not started"
        return self.process.wait(timeout=timeout)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process itself (0 when it is gone)."""
        return cpu_seconds(self.pid)

    def session_cpu(self) -> dict[int, float]:
        """CPU seconds of each live process of its session, by pid (a Celery worker's pool too)."""
        return {pid: cpu_seconds(pid) for pid in session_pids(self.pid)} if self.alive() else {}

    def kill(self) -> None:
        """SIGKILL the whole session, as a crash: nothing gets to clean up."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 15, signum: int | None = None) -> None:
        """SIGTERM (or `signum`: SIGINT), then SIGKILL if it does not stop in time (SIGCONT first,
        if it was stopped); then SIGKILL to what its session left behind (a Celery pool process)."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGCONT)
            os.killpg(self.process.pid, signal.SIGTERM if signum is None else signum)
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        except ProcessLookupError:
            pass
        for pid in session_pids(self.process.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class Manage(Process):
    """`python manage.py <args>`."""

    def __init__(self, *args: str, **env: str):
        super().__init__(sys.executable, "manage.py", *args, name=args[0] if args else "manage", env=env)
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
            env=env,
        )

    def received(self, task_id, task: str = "eventbus.run_job") -> int:
        """How many times the worker logged receiving this task."""
        return self.log().count(f"Task {task}[{task_id}] received")

    def pool_pids(self) -> list[int]:
        """The prefork pool's processes: the worker's children."""
        return child_pids(self.pid)


class Web(Process):
    """The gateway's server serving config.asgi on 127.0.0.1:<port>, as the Procfile runs it
    (uvicorn, gateway.uvicorn's protocol, no per-message deflate, the same limits)."""

    ready_text = "Uvicorn running on"

    def __init__(self, port: int, **env: str):
        super().__init__(
            str(BIN / "uvicorn"),
            "config.asgi:application",
            *("--host", "127.0.0.1", "--port", str(port)),
            *("--ws", "gateway.uvicorn:WebSocketProtocol", "--ws-per-message-deflate", "false"),
            # The Procfile's limits (a deadline for a request's head: gateway.uvicorn:HTTPProtocol) (docs/howto/deploy.md#limits).
            *("--ws-max-size", "4096", "--ws-ping-interval", "20", "--ws-ping-timeout", "20"),
            *("--http", "gateway.uvicorn:HTTPProtocol", "--timeout-keep-alive", "5"),
            *("--limit-concurrency", "10000"),
            *("--lifespan", "off"),
            name="web",
            env=env,
        )
        self.url = f"http://127.0.0.1:{port}"


# What /proc says of processes: the CPU time the benchmarks count, the processes of a session or a
# parent (a Celery pool), for Process.stop and the end-to-end harness (tests/e2e).


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command (fields[0] is the state, [1] the parent,
    [3] the session, [11] and [12] user and system CPU ticks); None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (0 when it is gone)."""
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS if fields else 0.0


def _pids_where(field: int, value: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = proc_stat(entry.name)
            if fields and int(fields[field]) == value:
                found.append(int(entry.name))
    return found


def child_pids(pid: int) -> list[int]:
    """The direct children of a process (a Celery worker's prefork pool), from /proc."""
    return _pids_where(1, pid)


def session_pids(sid: int) -> list[int]:
    """The processes of a session (a Process runs in one of its own: its sid is its pid)."""
    return _pids_where(3, sid)


def alive(process: Process) -> bool:
    """Started and not exited."""
    return process.alive()


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
