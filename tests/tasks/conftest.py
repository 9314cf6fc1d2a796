"""Fixtures of the backend's worker tests: real Celery workers on this run's Redis and test
database, a process that reads results with get_result, and the files the tasks write.

A worker here gets a short broker visibility timeout, so that a task whose worker was killed
outright is delivered again within a test (tests/eventbus/test_tasks_worker.py tells how), and
the file its task signals go to (tests.tasks.tasks records them there).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eventbus.models import Job
from tests.eventbus.helpers import point_broker, wait_for_job_state
from tests.processes import BASE_DIR, Worker, process_env
from tests.tasks.tasks import SIGNALS_FILE_ENV

# Longer than any task a test holds on a worker, or a task still in hand would be delivered again
# (harmless, but it would show as a second delivery in the worker's log).
VISIBILITY_TIMEOUT = 8


def celery_worker(
    name: str, *celery_args: str, visibility_timeout: int = VISIBILITY_TIMEOUT, **env: str
) -> Worker:
    """A prefork worker of concurrency 1 (not started); `celery_args` go after Worker's own
    (`-Q reports`)."""
    worker = Worker(name, CELERY_VISIBILITY_TIMEOUT=str(visibility_timeout), **env)  # type: ignore[arg-type]
    worker.command = (*worker.command, *celery_args)
    return worker


@pytest.fixture
def broker(redis_client, redis_url):
    """This process's Celery app publishes to the test Redis (flushed: no queued tasks)."""
    point_broker(redis_url)
    return redis_client


@pytest.fixture
def start_worker(broker):
    """Starts workers (celery_worker's arguments) on the flushed test Redis; stops them at the end."""
    workers: list[Worker] = []

    def start(name: str, *celery_args: str, **options) -> Worker:
        worker = celery_worker(name, *celery_args, **options)
        workers.append(worker)
        return worker.start(timeout=60)  # type: ignore[return-value]

    yield start
    for worker in workers:
        worker.stop()
        worker.log_path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def shared_worker(redis_url, django_db_setup, tmp_path_factory):
    """One worker for the module's tests (it serves the default queue, no -Q), recording the
    task signals it sends in `shared_worker.signals_path`. Each test waits for its tasks' end."""
    signals_path = tmp_path_factory.mktemp("signals") / "signals.txt"
    worker = celery_worker("tasks-shared", **{SIGNALS_FILE_ENV: str(signals_path)})
    worker.signals_path = signals_path
    worker.start(timeout=60)
    yield worker
    worker.stop()
    worker.log_path.unlink(missing_ok=True)


def read_lines(path) -> list[str]:
    """The lines a task appended to a file (none before the first)."""
    try:
        return Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []


def wait_for_state(result_id, state: str, *processes, timeout: float = 60) -> Job:
    """The task's job once it is in `state` (its workers' logs in the failure)."""
    return wait_for_job_state(
        result_id,
        state,
        lambda: "\n".join(process.log(tail=4000) for process in processes),
        timeout=timeout,
        what="task",
    )


# A process of its own that answers, for each result id it reads on stdin, what get_result()
# gives there: one JSON line.
READER = """
import json, sys
import django
django.setup()
from eventbus.djangotasks.compat import TaskResultStatus, task_backends
backend = task_backends["default"]
for line in sys.stdin:
    result = backend.get_result(line.strip())
    print(json.dumps({
        "id": result.id,
        "status": str(result.status),
        "return_value": result.return_value if result.status == TaskResultStatus.SUCCESSFUL else None,
        "errors": [
            {"exception_class_path": e.exception_class_path, "traceback": e.traceback} for e in result.errors
        ],
        "worker_ids": list(result.worker_ids),
        "attempts": result.attempts,
        "started": result.started_at is not None,
        "finished": result.finished_at is not None,
    }), flush=True)
"""


class ResultReader:
    """get_result() in another process (this run's settings and test database)."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-c", READER],
            cwd=BASE_DIR,
            env=process_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def read(self, result_id) -> dict:
        self.process.stdin.write(f"{result_id}\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the reader exited ({self.process.poll()})"
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def result_reader(redis_url):
    reader = ResultReader()
    yield reader
    reader.close()
