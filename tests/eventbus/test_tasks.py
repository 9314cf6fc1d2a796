"""Jobs in process: runs.run (lease, state, republish), enqueue and the sweep.

Real Redis and a real database; stages take no time (EVENTBUS STAGE_SECONDS is 0 in tests).
The real Celery worker runs in test_tasks_worker.py.
"""

import io
import json
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import redis
from django.core.management import call_command
from django.db import OperationalError
from django.utils import timezone

from config.jobs import ScanJob
from eventbus import tasks
from eventbus.bus.keys import JobKeys
from eventbus.bus.publish import publish_event
from eventbus.job import runs, stages
from eventbus.job.sweep import Sweeper, enqueue_pending
from eventbus.models import Job
from tests.postgres import kill_own_backend
from tests.processes import BASE_DIR, process_env, wait_for

from .helpers import broker_down, expected_events, job_events, queued_task_ids

State = Job.State
FINAL_SEQ = 51


# Helpers --------------------------------------------------------------------------------------


def final_data(client, domain: str, job_id) -> dict:
    job_id = str(job_id)
    for _id, fields in client.xrange(JobKeys(domain, job_id).stream):
        if fields[b"job_id"].decode() == job_id and int(fields[b"seq"]) == FINAL_SEQ:
            return json.loads(fields[b"data"])
    raise AssertionError(f"no final event for job {job_id}")


# runs.run ------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("domain,payload", [("scan", {}), ("chat", {"prompt": "tell me"})])
def test_run_publishes_every_event_once_and_completes(redis_client, make_job, domain, payload):
    job = make_job(domain, payload)
    assert runs.run(str(job.id)) == State.COMPLETED
    job.refresh_from_db()
    assert job.state == State.COMPLETED and job.completed_at is not None
    assert job_events(redis_client, domain, job.id) == expected_events(domain, payload)
    assert final_data(redis_client, domain, job.id)["state"] == "COMPLETED"


@pytest.mark.django_db
def test_a_finished_job_is_not_run_again(redis_client, make_job):
    job = make_job()
    runs.run(str(job.id))
    completed_at = Job.objects.get(pk=job.pk).completed_at
    assert runs.run(str(job.id)) == "skipped"
    assert Job.objects.get(pk=job.pk).completed_at == completed_at
    assert job_events(redis_client, "scan", job.id) == expected_events("scan")


@pytest.mark.django_db
def test_a_run_after_a_crash_republishes_from_the_start_without_copies(redis_client, make_job):
    # The first run published two events and died with the job RUNNING.
    job = make_job(state=State.RUNNING)
    job_id = str(job.id)
    for stage, seq in expected_events("scan")[:2]:
        assert publish_event("scan", job_id, stage, seq, {"first": "run"})
    assert runs.run(job_id) == State.COMPLETED
    assert job_events(redis_client, "scan", job_id) == expected_events("scan")
    assert Job.objects.get(pk=job_id).state == State.COMPLETED


@pytest.mark.django_db
def test_the_run_lease_lasts_its_own_setting_on_its_key(redis_client, make_job, eventbus_settings_override):
    job = make_job()
    keys = JobKeys(job.domain, str(job.id))
    assert keys.run_lease == f"{keys.tag}:run-lease:{job.id}"  # the text stored leases carry
    with eventbus_settings_override(RUN_LEASE_SECONDS=7, STAGE_SECONDS=30):
        lease = runs.RunLease(job)
        assert (lease.key, lease.seconds) == (keys.run_lease, 7)
        assert lease.acquire()
        assert 6000 < redis_client.pttl(keys.run_lease) <= 7000
        lease.release()


@pytest.mark.django_db
def test_a_second_run_waits_for_the_lease(redis_client, make_job):
    job = make_job()
    holder = runs.RunLease(job)
    assert holder.acquire()
    with pytest.raises(runs.JobBusy) as busy:
        runs.run(str(job.id))
    assert 0 < busy.value.retry_in <= holder.seconds + 0.2
    assert Job.objects.get(pk=job.pk).state == State.PENDING
    assert job_events(redis_client, "scan", job.id) == []
    holder.release()
    assert runs.run(str(job.id)) == State.COMPLETED


@pytest.mark.django_db
def test_a_lease_taken_over_is_neither_renewed_nor_released(redis_client, make_job):
    job = make_job()
    first, second = runs.RunLease(job), runs.RunLease(job)
    assert first.acquire() and not second.acquire()
    redis_client.delete(first.key)  # expired
    assert second.acquire()
    with pytest.raises(runs.RunLeaseLost):
        first.renew()
    first.release()
    assert redis_client.exists(second.key)
    second.renew()
    second.release()
    assert not redis_client.exists(second.key)


@pytest.mark.django_db
def test_a_run_whose_lease_is_taken_over_stops(redis_client, make_job, monkeypatch):
    job = make_job()

    def renew(lease):
        raise runs.RunLeaseLost("taken over")

    monkeypatch.setattr(runs.RunLease, "renew", renew)
    assert runs.run(str(job.id)) == "lease_lost"
    assert Job.objects.get(pk=job.pk).state == State.RUNNING  # the new holder finishes it
    assert job_events(redis_client, "scan", job.id) == expected_events("scan")[:1]


@pytest.mark.django_db
def test_an_exception_fails_the_job_with_a_log_line_and_a_final_event(
    redis_client, make_job, monkeypatch, caplog
):
    job = make_job()

    def broken(self, ctx):
        raise RuntimeError("the rules engine exploded")

    monkeypatch.setattr(ScanJob, "answer", broken)
    assert runs.run(str(job.id)) == State.FAILED
    job.refresh_from_db()
    assert job.state == State.FAILED and job.completed_at is not None
    assert f"Job {job.id} failed: RuntimeError: the rules engine exploded" in caplog.text
    assert job_events(redis_client, "scan", job.id) == [
        ("vision", 10),
        ("rule", 20),
        ("done", FINAL_SEQ),
    ]
    assert final_data(redis_client, "scan", job.id) == {
        "label": "Done",
        "progress": 100,
        "state": "FAILED",
        "final": True,
        "error": {"stage": "answer", "type": "RuntimeError", "message": "the rules engine exploded"},
    }
    assert runs.run(str(job.id)) == "skipped"


@pytest.mark.django_db
def test_a_stage_that_raises_tells_its_owner_the_stage_and_the_message_and_staff_the_traceback(
    redis_client, make_job, tmp_path, api_client
):
    from eventbus.models import StageRecord

    job = make_job("staged", {"log": str(tmp_path / "log"), "raise": "card declined"})
    assert runs.run(str(job.id)) == State.FAILED
    error = {"stage": "second", "type": "ValueError", "message": "card declined"}
    final = [
        json.loads(f[b"data"])
        for _, f in redis_client.xrange(JobKeys("staged", str(job.id)).stream)
        if f[b"job_id"].decode() == str(job.id) and f[b"stage"] == b"done"
    ]
    assert [data["error"] for data in final] == [error]
    detail = api_client.get(f"/api/jobs/{job.id}/").json()
    assert detail["state"] == "FAILED" and detail["error"] == error
    record = StageRecord.objects.get(job=job, stage="second")
    assert (record.error_type, record.error_message, record.finished_at) == (
        "ValueError",
        "card declined",
        None,
    )
    assert 'raise ValueError(ctx.payload["raise"])' in record.error_traceback
    assert record.error_traceback.rstrip().endswith("ValueError: card declined")
    redis_client.flushdb()  # the final event gone from Redis: the detail still says why
    assert api_client.get(f"/api/jobs/{job.id}/").json()["error"] == error


@pytest.mark.django_db
def test_a_failures_message_is_bounded(redis_client, make_job, tmp_path, api_client):
    job = make_job("staged", {"log": str(tmp_path / "log"), "raise": "x" * 5_000})
    assert runs.run(str(job.id)) == State.FAILED
    message = api_client.get(f"/api/jobs/{job.id}/").json()["error"]["message"]
    assert len(message) == stages.MAX_ERROR_MESSAGE and message.endswith("…")


@pytest.mark.django_db
def test_a_failure_an_attempt_later_finishes_is_forgotten(redis_client, make_job, tmp_path, monkeypatch):
    """A stage that raised a Redis error (retried) and then finished keeps no error."""
    from eventbus.models import StageRecord

    from .jobtypes import StagedJob

    job = make_job("staged", {"log": str(tmp_path / "log")})
    monkeypatch.setattr(
        StagedJob, "third", lambda self, ctx: (_ for _ in ()).throw(redis.TimeoutError("away"))
    )
    with pytest.raises(redis.TimeoutError):
        runs.run(str(job.id), fail_on_transient=False)
    assert StageRecord.objects.get(job=job, stage="third").error_type == "TimeoutError"
    monkeypatch.undo()
    assert runs.run(str(job.id)) == State.COMPLETED
    record = StageRecord.objects.get(job=job, stage="third")
    assert (record.error_type, record.error_message, record.error_traceback, record.failed_at) == (None,) * 4


@pytest.mark.django_db
def test_an_unknown_domain_fails_the_job(redis_client, make_job):
    job = make_job(domain="nope")
    assert runs.run(str(job.id)) == State.FAILED
    assert Job.objects.get(pk=job.pk).state == State.FAILED


@pytest.mark.django_db
def test_redis_going_away_is_retried_until_the_last_attempt(redis_client, make_job, monkeypatch):
    job = make_job()

    def unreachable(*args):
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(stages, "publish_event", unreachable)
    with pytest.raises(redis.ConnectionError):
        runs.run(str(job.id), fail_on_transient=False)
    assert Job.objects.get(pk=job.pk).state == State.RUNNING
    assert not redis_client.exists(runs.RunLease(job).key)  # released for the retry
    assert runs.run(str(job.id), fail_on_transient=True) == State.FAILED
    assert Job.objects.get(pk=job.pk).state == State.FAILED


@pytest.mark.django_db
def test_a_job_past_its_deadline_times_out(redis_client, make_job):
    job = make_job(deadline=timezone.now() - timedelta(seconds=1))
    assert runs.run(str(job.id)) == State.TIMED_OUT
    assert Job.objects.get(pk=job.pk).state == State.TIMED_OUT
    assert job_events(redis_client, "scan", job.id) == [("done", FINAL_SEQ)]
    assert final_data(redis_client, "scan", job.id)["state"] == "TIMED_OUT"


@pytest.mark.django_db
def test_a_missing_job_is_not_run(redis_client):
    assert runs.run("00000000-0000-0000-0000-000000000000") == "missing"


# enqueue and the sweep -----------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue_sends_one_task_named_after_the_job(broker, make_job):
    job = make_job()
    assert tasks.enqueue(job)
    assert queued_task_ids(broker) == [str(job.id)]
    assert Job.objects.get(pk=job.pk).enqueued_at is not None


@pytest.mark.django_db
def test_enqueue_with_the_broker_down_gives_up_fast_and_never_raises(broker, make_job, caplog):
    job = make_job()
    with broker_down():
        started = time.monotonic()
        assert tasks.enqueue(job) is False
        assert time.monotonic() - started < 3  # connection refused: no retry loop
    assert Job.objects.get(pk=job.pk).enqueued_at is None
    assert f"Job {job.id} not enqueued" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_post_enqueues_one_task_after_commit_and_a_replay_none(broker, api_client):
    def post():
        return api_client.post(
            "/api/jobs/", {"domain": "scan", "payload": {"n": 1}}, format="json", HTTP_IDEMPOTENCY_KEY="job-1"
        )

    first = post()
    assert first.status_code == 201
    job_id = first.json()["job_id"]
    assert queued_task_ids(broker) == [job_id]
    assert Job.objects.get(pk=job_id).enqueued_at is not None
    replay = post()
    assert (replay.status_code, replay.json(), replay["Idempotent-Replayed"]) == (201, first.json(), "true")
    assert queued_task_ids(broker) == [job_id]


@pytest.mark.django_db(transaction=True)
def test_a_post_with_the_broker_down_is_accepted_and_left_to_the_sweep(broker, api_client):
    with broker_down():
        response = api_client.post(
            "/api/jobs/", {"domain": "chat"}, format="json", HTTP_IDEMPOTENCY_KEY="down"
        )
    assert response.status_code == 201
    job_id = response.json()["job_id"]
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.enqueued_at) == (State.PENDING, None)
    assert queued_task_ids(broker) == []
    assert enqueue_pending(older_than_seconds=0) == 1
    assert queued_task_ids(broker) == [job_id]
    assert enqueue_pending(older_than_seconds=0) == 0


@pytest.mark.django_db
def test_enqueue_pending_takes_only_old_never_enqueued_pending_jobs(broker, make_job):
    old = timezone.now() - timedelta(minutes=5)
    lost = make_job(accepted_at=old)
    make_job(accepted_at=timezone.now())  # may still be on its way, after commit
    make_job(accepted_at=old, enqueued_at=old)
    make_job(accepted_at=old, state=State.RUNNING)
    make_job(accepted_at=old, state=State.COMPLETED)
    assert enqueue_pending(older_than_seconds=30) == 1
    assert queued_task_ids(broker) == [str(lost.id)]
    with broker_down():
        assert enqueue_pending(older_than_seconds=0) == 0  # the fresh one stays for the next pass
    assert enqueue_pending(older_than_seconds=0) == 1


@pytest.mark.django_db
def test_sweep_jobs_burst(broker, make_job):
    make_job(accepted_at=timezone.now() - timedelta(minutes=5))
    out = io.StringIO()
    call_command("sweep_jobs", burst=True, stdout=out)
    assert out.getvalue() == "Enqueued 1 job(s).\n"
    assert len(queued_task_ids(broker)) == 1


@pytest.mark.django_db
def test_sweeper_loops_until_stopped(broker, make_job, monkeypatch):
    sweeper = Sweeper(interval=0.01, older_than_seconds=0)
    passes = []

    def counting(**kwargs):
        passes.append(1)
        if len(passes) == 3:
            make_job()
        if len(passes) == 5:
            threading.Thread(target=sweeper.request_stop).start()
        return enqueue_pending(**kwargs)

    monkeypatch.setattr("eventbus.job.sweep.enqueue_pending", counting)
    assert sweeper.run() == 1
    assert len(passes) >= 5


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres  # kills a PostgreSQL backend
def test_sweeper_outlives_its_database_backend(broker, make_job, caplog):
    """Its backend killed (a failover, an administrator): the failed pass is logged, the next
    one runs on a new connection, rather than every pass after it failing on the dead one."""
    sweeper = Sweeper(interval=0.01, older_than_seconds=0)
    passes = []

    def losing_its_backend(**kwargs):
        passes.append(1)
        if len(passes) == 2:
            kill_own_backend()
        if len(passes) == 3:
            make_job()
        if len(passes) == 5:
            threading.Thread(target=sweeper.request_stop).start()
        return enqueue_pending(**kwargs)

    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as patched:
        patched.setattr("eventbus.job.sweep.enqueue_pending", losing_its_backend)
        assert sweeper.run() == 1
    assert len(passes) >= 5
    assert any("a unit of work failed" in r.getMessage() for r in caplog.records)


@pytest.mark.django_db(transaction=True)
def test_sweep_jobs_stops_cleanly_on_sigterm(broker):
    process = subprocess.Popen(
        [sys.executable, "manage.py", "sweep_jobs", "--interval", "0.1"],
        cwd=BASE_DIR,
        env=process_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr_lines = []
    reader = threading.Thread(target=lambda: stderr_lines.extend(process.stderr), daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: process.poll() is not None or any("Sweeping" in line for line in stderr_lines),
            timeout=30,
            message="the sweeper to start",
        )
        assert process.poll() is None, "".join(stderr_lines)
        process.terminate()
        stdout = process.stdout.read()
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(timeout=5)
    stderr = "".join(stderr_lines)
    assert process.returncode == 0, stderr
    assert stdout == "Enqueued 0 job(s).\n"
    assert "SIGTERM, stopping" in stderr


def _worker_task():
    """A task as a worker runs it (not eagerly), for eventbus.tasks.request_connections."""
    from types import SimpleNamespace

    return SimpleNamespace(request=SimpleNamespace(is_eager=False))


@pytest.mark.django_db(transaction=True)
def test_a_run_keeps_its_connection_as_conn_max_age_allows():
    from django.db import connection

    connection.ensure_connection()
    connection.close_at = time.monotonic() + 60  # as CONN_MAX_AGE = 60 sets it at connect
    raw = connection.connection
    with tasks.request_connections(_worker_task()):
        assert Job.objects.count() == 0
    assert connection.connection is raw  # kept: no new connection for the next run

    connection.close_at = time.monotonic() - 1  # older than CONN_MAX_AGE (0 closes at once)
    with tasks.request_connections(_worker_task()):
        pass
    assert connection.connection is None


@pytest.mark.postgres  # SQLite's connections are always usable: none is found broken
@pytest.mark.django_db(transaction=True)
def test_a_run_drops_a_broken_connection_first():
    from django.db import connection

    connection.ensure_connection()
    connection.close_at = time.monotonic() + 60
    raw = connection.connection
    kill_own_backend()  # the server ends it under the run's feet
    with pytest.raises(OperationalError):
        Job.objects.count()  # a query fails, and Django marks the connection
    with tasks.request_connections(_worker_task()):
        assert Job.objects.count() == 0  # a new connection: the broken one was dropped first
    assert connection.connection is not raw


@pytest.mark.django_db
def test_an_eager_run_leaves_the_callers_connection_alone():
    from types import SimpleNamespace

    from django.db import connection

    raw = connection.connection
    with tasks.request_connections(SimpleNamespace(request=SimpleNamespace(is_eager=True))):
        pass
    assert connection.connection is raw and connection.in_atomic_block  # the test's transaction stands


@pytest.mark.django_db(transaction=True)
def test_sending_a_run_from_new_threads_builds_no_result_backend(broker, make_job, monkeypatch):
    """Django's ASGI handler runs each request in a new thread; Celery builds its app's result
    backend once per thread (scanning every package's entry points) unless the task has its own."""
    from django.db import connection

    app = type(tasks.run_job.app)
    built = []
    real = app._get_backend
    monkeypatch.setattr(app, "_get_backend", lambda self: built.append(1) or real(self))
    jobs = [make_job(), make_job()]

    def send(job):
        try:
            assert tasks.enqueue(job)
        finally:
            connection.close()

    for job in jobs:  # a thread each, as two requests
        thread = threading.Thread(target=send, args=(job,))
        thread.start()
        thread.join()
    assert built == []
    assert sorted(queued_task_ids(broker)) == sorted(str(job.id) for job in jobs)
