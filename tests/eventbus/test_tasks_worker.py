"""run_job on a real Celery worker (prefork, Redis broker) against this run's test database.

The worker gets the resolved test database name (TEST_DATABASE_NAME, honoured by the test
settings), stages of STAGE_SECONDS so that it can be killed mid-job, and a short broker
visibility timeout, so that a task whose worker was killed outright is delivered again within
the test: kombu's Redis transport keeps a delivered, unacknowledged message in its `unacked`
hash and puts it back in the queue once it is older than the visibility timeout (at a
worker's start, and on its periodic restore sweep).
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import call_command

from eventbus.jobs import RunLease
from idempotency.models import Operation

from .test_tasks import broker  # noqa: F401 (fixture)
from .test_tasks import (
    BASE_DIR, broker_down, expected_events, job_events, process_env, queued_task_ids, wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

CELERY = str(Path(sys.executable).parent / "celery")
STAGE_SECONDS = 0.3  # a scan job runs ~1.2 s: time to kill its worker in the middle
# Longer than a job and than a lease wait (the countdown of a task that found the lease held),
# or a task still in hand would be delivered a second time: harmless, but noise.
VISIBILITY_TIMEOUT = 8
State = Operation.State


class Worker:
    """`celery -A config worker -P prefork -c 1` in a session of its own, logging to a file."""

    def __init__(self, log_path: Path, name: str):
        self.log_path = log_path
        self.name = name
        self.process = None

    def start(self) -> "Worker":
        env = process_env(
            EVENTBUS_STAGE_SECONDS=str(STAGE_SECONDS), CELERY_VISIBILITY_TIMEOUT=str(VISIBILITY_TIMEOUT)
        )
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [CELERY, "-A", "config", "worker", "-P", "prefork", "-c", "1", "--loglevel", "INFO",
             "-n", f"{self.name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=BASE_DIR, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        wait_for(lambda: self.process.poll() is not None or " ready." in self.log(), timeout=30,
                 message=f"worker {self.name} to start")
        assert self.process.poll() is None, self.log()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def received(self, job_id) -> int:
        return self.log().count(f"Task eventbus.run_job[{job_id}] received")

    def pool_pids(self) -> list[int]:
        """The prefork pool's processes: the worker's children."""
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.process.pid:
                pids.append(int(stat.parent.name))
        return pids

    def kill(self) -> None:
        """SIGKILL the worker and its pool, as a crashed machine: nothing acks or requeues."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()


@pytest.fixture
def start_worker(broker, tmp_path):
    """Starts workers against the (flushed) test Redis; stops them all at the end."""
    workers = []

    def start(name="w1"):
        worker = Worker(tmp_path / f"{name}.log", name)
        workers.append(worker)
        return worker.start()

    yield start
    for worker in workers:
        worker.stop()


def post_job(api_client, domain="scan", payload=None, key="key-1"):
    return api_client.post(
        "/api/jobs/", {"domain": domain, "payload": payload or {}}, format="json", HTTP_IDEMPOTENCY_KEY=key
    )


def wait_for_state(job_id, state, worker_logs, timeout=40):
    def reached():
        return Operation.objects.get(pk=job_id).state == state

    try:
        wait_for(reached, timeout=timeout, interval=0.05, message=f"job {job_id} to be {state}")
    except AssertionError:
        raise AssertionError(
            f"job {job_id} is {Operation.objects.get(pk=job_id).state}, not {state}; worker logs:\n"
            + "\n".join(log()[-4000:] for log in worker_logs)
        ) from None


def kill_mid_job(broker, job_id, kill):
    """Once the job has published its first event (and not its last), `kill()`."""
    wait_for(lambda: job_events(broker, "scan", job_id), timeout=30, interval=0.01, message="the first event")
    kill()
    published = job_events(broker, "scan", job_id)
    assert 1 <= len(published) < len(expected_events("scan")), f"not mid-job: {published}"
    assert Operation.objects.get(pk=job_id).state == State.RUNNING
    return published


def test_a_post_runs_its_job_once_to_completed_and_a_replay_enqueues_none(start_worker, broker, api_client):
    first = post_job(api_client, "scan", key="scan-1")
    chat = post_job(api_client, "chat", {"prompt": "what is exactly-once?"}, key="chat-1")
    replay = post_job(api_client, "scan", key="scan-1")
    assert (first.status_code, chat.status_code, replay.status_code) == (201, 201, 201)
    assert replay["Idempotent-Replayed"] == "true" and replay.json() == first.json()
    scan_id, chat_id = first.json()["job_id"], chat.json()["job_id"]
    # Exactly one task per accepted job reached the broker; the replay sent none.
    assert queued_task_ids(broker) == [chat_id, scan_id]  # LPUSH: newest first

    worker = start_worker()
    wait_for_state(scan_id, State.COMPLETED, [worker.log])
    wait_for_state(chat_id, State.COMPLETED, [worker.log])
    assert job_events(broker, "scan", scan_id) == expected_events("scan")
    assert job_events(broker, "chat", chat_id) == expected_events("chat", {"prompt": "what is exactly-once?"})
    assert (worker.received(scan_id), worker.received(chat_id)) == (1, 1)
    operation = Operation.objects.get(pk=scan_id)
    assert operation.enqueued_at is not None and operation.completed_at is not None
    assert post_job(api_client, "scan", key="scan-1")["Idempotent-Replayed"] == "true"
    assert queued_task_ids(broker) == []


def test_a_worker_killed_mid_job_leaves_the_task_to_the_next_worker(start_worker, broker, api_client):
    first = start_worker("w1")
    job_id = post_job(api_client).json()["job_id"]
    kill_mid_job(broker, job_id, first.kill)
    # Nobody acked or requeued it: the message waits in kombu's unacked hash.
    assert broker.hlen("unacked") == 1 and queued_task_ids(broker) == []

    second = start_worker("w2")
    wait_for_state(job_id, State.COMPLETED, [first.log, second.log], timeout=VISIBILITY_TIMEOUT + 30)
    assert second.received(job_id) >= 1
    assert job_events(broker, "scan", job_id) == expected_events("scan")
    assert broker.hlen("unacked") == 0


def test_a_pool_process_killed_mid_job_is_requeued_and_run_again(start_worker, broker, api_client):
    worker = start_worker()
    job_id = post_job(api_client).json()["job_id"]
    [child] = worker.pool_pids()
    kill_mid_job(broker, job_id, lambda: os.kill(child, signal.SIGKILL))

    wait_for_state(job_id, State.COMPLETED, [worker.log], timeout=RunLease.min_seconds + 30)
    log = worker.log()
    assert "WorkerLostError" in log, log
    # Requeued at once (reject_on_worker_lost); the dead run's lease made it wait, then it ran.
    assert worker.received(job_id) >= 2, log
    assert job_events(broker, "scan", job_id) == expected_events("scan")


def test_a_job_accepted_while_the_broker_was_down_is_swept_and_completes(start_worker, broker, api_client):
    with broker_down():
        started = time.monotonic()
        response = post_job(api_client, "chat", {"prompt": "are you there?"})
        elapsed = time.monotonic() - started
    assert response.status_code == 201 and elapsed < 5
    job_id = response.json()["job_id"]
    assert Operation.objects.get(pk=job_id).enqueued_at is None

    worker = start_worker()
    assert queued_task_ids(broker) == [] and worker.received(job_id) == 0
    call_command("sweep_operations", burst=True, older_than=0)
    wait_for_state(job_id, State.COMPLETED, [worker.log])
    assert job_events(broker, "chat", job_id) == expected_events("chat", {"prompt": "are you there?"})
    assert worker.received(job_id) == 1
    assert Operation.objects.get(pk=job_id).enqueued_at is not None
