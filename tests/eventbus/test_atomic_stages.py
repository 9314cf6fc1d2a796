"""Atomic stages (Stage(atomic=True)) on a real Celery worker, whose pool process is SIGKILLed at
each point of the stage's life: before its code, in the middle of its writes, after them (before
the commit), after the commit. Whatever the point, the job's ledger lines are there exactly once
(never none, never twice) and the stage was recorded finished by the attempt that wrote them.

The worker (prefork, one pool process) and its Redis (a private, append-only redis-server) start
once for the module (`durable_processes`, which tests/eventbus/test_durable_worker.py uses too).
A killed pool process's task goes back to the queue at once (acks_late, reject_on_worker_lost);
its new run waits for the dead run's lease to expire (EVENTBUS["RUN_LEASE_SECONDS"]), then runs
the stages not finished.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass

import pytest
from django.test.utils import override_settings

from config import celery_app
from config.models import LedgerEntry
from config.redis_server import RedisServer, new_password
from eventbus.bus.keys import JobKeys
from eventbus.models import Job, StageRecord
from eventbus.services import start_job
from tests.processes import Manage, Worker, wait_for

from .helpers import job_events, point_broker, wait_for_job_state
from .jobtypes import LEDGER_ROWS, lines

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]
State = Job.State

# A whole worker SIGKILLed leaves its task in the broker's unacked hash: delivered again once
# older than this (kombu's Redis transport), well within a test.
VISIBILITY_TIMEOUT = 8


@dataclass
class DurableProcesses:
    """A private append-only Redis, a Celery worker on it and, if asked, a sweeper (sweep_jobs:
    it sends the due delayed and WAITING runs), all on this run's test database; this process's
    bus and Celery app point at that Redis while they run."""

    server: RedisServer
    worker: Worker
    sweeper: Manage | None

    def logs(self) -> str:
        return "\n".join(
            f"--- {process.name}:\n{process.log(tail=6000)}"
            for process in (self.worker, self.sweeper)
            if process
        )

    def client(self):
        return self.server.client()

    def start(self) -> None:
        self.worker.start(wait=False)
        if self.sweeper is not None:
            self.sweeper.start()
        wait_for(self.worker.ready, timeout=60, message=f"the worker ready:\n{self.worker.log()}")
        point_broker(self.server.url)  # a new connection pool: the old one may lead to a dead server

    def stop(self) -> None:
        for process in (self.worker, self.sweeper):
            if process is not None:
                process.stop()

    def restart(self) -> None:
        """SIGKILL the worker, the sweeper and Redis, as a crash of the machine would; start
        them again, Redis from its append-only file."""
        for process in (self.worker, self.sweeper):
            if process is not None:
                process.kill()
        self.server.kill()
        self.server.start()
        self.start()


def durable_processes(tmp_path_factory, name: str, *, sweeper: bool):
    """Start them (a generator for a module fixture): see DurableProcesses."""
    server = RedisServer(
        data_dir=tmp_path_factory.mktemp("redis"),
        durable=True,
        password=new_password(),
        args=("--appendfsync", "always"),  # nothing lost when the tests SIGKILL it
    ).start()
    env = {"REDIS_URL": server.url, "CELERY_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT)}
    processes = DurableProcesses(
        server,
        Worker(name, **env),  # type: ignore[arg-type]
        Manage("sweep_jobs", **env) if sweeper else None,
    )
    previous_broker = celery_app.conf.broker_url
    try:
        with override_settings(REDIS_URL=server.url, CELERY_BROKER_URL=server.url):
            processes.start()
            yield processes
    finally:
        processes.stop()
        for process in (processes.worker, processes.sweeper):
            if process is not None:
                process.log_path.unlink(missing_ok=True)
        server.stop()
        point_broker(previous_broker)


@pytest.fixture(scope="module")
def processes(redis_url, django_db_setup, tmp_path_factory):
    yield from durable_processes(tmp_path_factory, "atomic", sweeper=False)


def wait_for_state(job_id, state: str, processes: DurableProcesses, timeout: float = 90) -> Job:
    return wait_for_job_state(job_id, state, processes.logs, timeout=timeout)


def attempts(job_id) -> dict[str, int]:
    return dict(StageRecord.objects.filter(job_id=job_id).values_list("stage", "attempts"))


def ledger(job_id) -> list[int]:
    return list(LedgerEntry.objects.filter(job_id=job_id).order_by("pk").values_list("pk", flat=True))


def assert_one_stream(client, domain: str, job_id) -> dict[str, int]:
    """The job's stream holds each seq once, in order, its final event last: the events of the
    runs cut short were dropped as duplicates. Returns the events per stage."""
    events = job_events(client, domain, job_id)
    seqs = [seq for _stage, seq in events]
    assert seqs == sorted(set(seqs)), events
    assert events and events[-1][0] == "done", events
    per_stage: dict[str, int] = {}
    for stage, _seq in events:
        per_stage[stage] = per_stage.get(stage, 0) + 1
    return per_stage


def final_states(client, domain: str, job_id) -> list[str]:
    job_id = str(job_id)
    return [
        json.loads(fields[b"data"])["state"]
        for _id, fields in client.xrange(JobKeys(domain, job_id).stream)
        if fields[b"job_id"].decode() == job_id and fields[b"stage"] == b"done"
    ]


def kill_pool_process(processes: DurableProcesses) -> None:
    """SIGKILL the worker's pool process (the run in it dies mid-stage, as in a crash); the
    worker starts another, which gets the task again."""
    [child] = processes.worker.pool_pids()
    os.kill(child, signal.SIGKILL)
    wait_for(
        lambda: processes.worker.pool_pids() not in ([], [child]),
        timeout=30,
        message=f"a new pool process:\n{processes.logs()}",
    )


# Where each pause point is, and what its kill leaves to the next run: the attempts each stage
# took, and the attempt of the atomic stage that wrote the lines.
KILLED_AT = {
    "before_code": ({"prepare": 2, "pay": 1, "finish": 1}, 1),
    "mid_code": ({"prepare": 1, "pay": 2, "finish": 1}, 2),
    "after_writes": ({"prepare": 1, "pay": 2, "finish": 1}, 2),
    "after_commit": ({"prepare": 1, "pay": 1, "finish": 2}, 1),
}


@pytest.mark.parametrize("point", list(KILLED_AT))
def test_a_pool_process_killed_at_each_point_leaves_the_ledger_lines_exactly_once(
    processes, user, tmp_path, point
):
    log, marker = str(tmp_path / "log"), tmp_path / "marker"
    payload = {"log": log, "pause_at": point, "marker": str(marker)}
    job, _ = start_job("atomic_ledger", payload, key=f"atomic-{point}", owner=user)
    wait_for(marker.exists, timeout=60, message=f"the pause {point}:\n{processes.logs()}")
    before, lost = ledger(job.id), processes.worker.log().count("WorkerLostError")
    if point == "after_commit":
        assert len(before) == LEDGER_ROWS, "committed with the stage's finish"
    else:
        assert before == [], "the lines written so far are not committed (the transaction is open)"
    kill_pool_process(processes)

    wait_for_state(job.id, State.COMPLETED, processes)
    expected_attempts, writer = KILLED_AT[point]
    assert attempts(job.id) == expected_attempts
    entries = ledger(job.id)
    assert len(entries) == LEDGER_ROWS, f"{len(entries)} ledger lines, not {LEDGER_ROWS}"
    if point == "after_commit":
        assert entries == before, "the committed lines were kept, none added"
    pay = StageRecord.objects.get(job_id=job.id, stage="pay")
    # Recorded finished once, by the attempt whose lines committed (the same rows).
    assert pay.finished_at is not None and pay.error_type is None
    assert pay.result == {"entries": entries, "attempt": writer}
    assert lines(log).count(f"pay attempt {writer}") == 1
    assert [line for line in lines(log) if line.startswith("pay ")] == [
        f"pay attempt {n}" for n in range(1, expected_attempts["pay"] + 1)
    ]
    with processes.client() as client:
        per_stage = assert_one_stream(client, "atomic_ledger", job.id)
        assert per_stage == {"prepare": 1, "pay": LEDGER_ROWS, "finish": 1, "done": 1}
        assert final_states(client, "atomic_ledger", job.id) == ["COMPLETED"]
    assert processes.worker.log().count("WorkerLostError") > lost, "the run was killed"


def test_an_attempt_that_raises_after_its_writes_leaves_none_and_its_retry_writes_them_once(
    processes, user, tmp_path
):
    log, release = str(tmp_path / "log"), tmp_path / "release"
    payload = {"log": log, "fail_after_writes": True, "release": str(release)}
    job, _ = start_job("atomic_ledger", payload, key="atomic-fails", owner=user)
    # The retry has started (its record says so) and waits for the release before its writes.
    wait_for(lambda: "pay attempt 2" in lines(log), timeout=60, message=f"the retry:\n{processes.logs()}")
    pay = StageRecord.objects.get(job_id=job.id, stage="pay")
    assert pay.attempts == 2 and pay.error_type == "RuntimeError" and pay.finished_at is None
    assert ledger(job.id) == [], "the failed attempt's lines were rolled back"
    release.touch()

    wait_for_state(job.id, State.COMPLETED, processes)
    entries = ledger(job.id)
    assert len(entries) == LEDGER_ROWS
    pay.refresh_from_db()
    assert pay.result == {"entries": entries, "attempt": 2}
    assert (pay.attempts, pay.error_type, pay.failed_at) == (2, None, None)
    assert lines(log) == ["prepare attempt 1", "pay attempt 1", "pay attempt 2", "finish attempt 1"]
