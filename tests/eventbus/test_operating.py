"""Operating jobs in process (real Redis, real database): stage policies, cancel_job,
retry_job, start_job and the retry_jobs command, the jobs API's cancel and retry, and their
races with real threads (run them on PostgreSQL: DATABASE_URL). The real worker runs them in
test_operating_worker.py."""

import io
import json
import time
import uuid
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.utils import timezone

from eventbus.bus.keys import JobKeys
from eventbus.exceptions import JobEnded, JobNotRetryable
from eventbus.job import recovery, runs
from eventbus.job.stages import StageRetry
from eventbus.jobtypes import InvalidPayload, JobFailed, Stage, StageTimeout, UnknownJobType
from eventbus.models import Job, StageRecord
from eventbus.services import cancel_job, retry_job, start_job
from eventbus.testing import events_of
from idempotency.exceptions import IdempotencyKeyMismatch
from tests.idempotency.test_concurrency import in_threads
from tests.processes import wait_for

from .helpers import job_events, queued_task_ids
from .jobtypes import FlakyJob, flaky_payload, lines, outside_api_calls, outside_api_charges, outside_api_down

State = Job.State


def run_to_end(job_id, *, attempts: int = 20) -> str:
    """runs.run, again after each stage retry's countdown (what the task's retry does)."""
    for _ in range(attempts):
        try:
            return runs.run(str(job_id))
        except StageRetry as retry:
            time.sleep(retry.countdown)
    raise AssertionError(f"job {job_id} still retrying after {attempts} runs")


def finals(client, job_id, domain="flaky") -> list[dict]:
    job_id = str(job_id)
    return [
        json.loads(fields[b"data"])
        for _id, fields in client.xrange(JobKeys(domain, job_id).stream)
        if fields[b"job_id"].decode() == job_id and fields[b"stage"] == b"done"
    ]


# Stage policy ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [{"retries": -1}, {"retries": 1.5}, {"retry_on": ("x",)}, {"backoff": -1}, {"timeout": 0}],
)
def test_a_stage_policy_the_engine_cannot_follow_is_refused(options):
    with pytest.raises(ImproperlyConfigured):
        Stage("pay", "Paying", **options)


def test_the_backoff_doubles_per_attempt_with_jitter():
    stage = Stage("pay", retries=5, backoff=2)
    for attempt in (1, 2, 3, 4):
        delays = [stage.retry_delay(attempt) for _ in range(200)]
        base = 2 * 2 ** (attempt - 1)
        assert all(0.8 * base <= d <= 1.2 * base for d in delays)
        assert len(set(delays)) > 1


def test_what_a_stage_retries():
    stage = Stage("pay", retries=2, retry_on=(ConnectionError,))
    assert stage.retryable(ConnectionError(), 1) and stage.retryable(ConnectionError(), 2)
    assert not stage.retryable(ConnectionError(), 3)  # 1 attempt + 2 retries
    assert not stage.retryable(ValueError(), 1)
    assert stage.retryable(StageTimeout(), 1)  # a timeout always is
    assert not Stage("pay", retries=2).retryable(JobFailed("no"), 1)  # the stage chose to fail
    assert not Stage("pay").retryable(ConnectionError(), 1)  # retries=0


# events_of ---------------------------------------------------------------------------------


def test_events_of_runs_the_retries_a_stage_policy_allows(redis_client, tmp_path):
    payload = flaky_payload(tmp_path)
    outside_api_down(payload["api"], 0)
    clean = events_of(FlakyJob, payload)
    run = events_of(FlakyJob, payload, fail={"pay": [ConnectionError("503"), ConnectionError, None]})
    assert run.state == "COMPLETED" and run.attempts["pay"] == 3 and run.error is None
    assert [(s, seq) for s, seq, _ in run] == [(s, seq) for s, seq, _ in clean]

    failed = events_of(FlakyJob, payload, fail={"pay": [ConnectionError("503")] * 4})
    assert failed.state == "FAILED" and failed.attempts["pay"] == 4
    assert failed.error == {"stage": "pay", "type": "ConnectionError", "message": "503"}
    assert failed[-1][2]["state"] == "FAILED" and failed[-1][2]["error"] == failed.error

    refused = events_of(FlakyJob, payload, fail={"pay": [ValueError("card declined")]})
    assert (refused.state, refused.attempts) == ("FAILED", {"prepare": 1, "pay": 1})
    stopped = events_of(FlakyJob, payload, fail={"pay": [JobFailed("no", code=3)]})
    assert stopped[-1][2]["code"] == 3 and stopped.error["type"] == "JobFailed"
    with pytest.raises(ValueError, match="does not declare"):
        events_of(FlakyJob, payload, fail={"nope": [ValueError]})


# Retries and timeouts, in process ------------------------------------------------------------


@pytest.mark.django_db
def test_a_stage_past_its_timeout_is_stopped_at_its_report_and_retried(
    redis_client, make_job, tmp_path, monkeypatch
):
    stages = list(FlakyJob.stages)
    stages[2] = Stage("wait", "Waiting", width=50, timeout=0.3, retries=1, backoff=0.01)
    monkeypatch.setattr(FlakyJob, "stages", tuple(stages))
    payload = flaky_payload(tmp_path, wait=3)
    outside_api_down(payload["api"], 0)
    job = make_job("flaky", payload)
    assert run_to_end(job.id) == State.FAILED
    record = StageRecord.objects.get(job=job, stage="wait")
    assert (record.attempts, record.error_type, record.state) == (2, "StageTimeout", "FAILED")
    waits = [seq for stage, seq in job_events(redis_client, "flaky", job.id) if stage == "wait"]
    assert 1 <= len(waits) < 10  # stopped at a report after 0.3 s of its 3 s
    assert finals(redis_client, job.id)[0]["error"]["type"] == "StageTimeout"


@pytest.mark.django_db
def test_a_run_before_its_stages_retry_is_due_runs_nothing(redis_client, make_job, tmp_path):
    """A duplicate message (or the recovery) that arrives while a retry waits waits too."""
    payload = flaky_payload(tmp_path)
    outside_api_down(payload["api"], 1)
    job = make_job("flaky", payload)
    with pytest.raises(StageRetry):
        runs.run(str(job.id))
    record = StageRecord.objects.get(job=job, stage="pay")
    assert record.state == "RETRYING" and record.next_attempt_at > timezone.now() - timedelta(seconds=1)
    StageRecord.objects.filter(pk=record.pk).update(next_attempt_at=timezone.now() + timedelta(hours=1))
    with pytest.raises(StageRetry) as waited:
        runs.run(str(job.id))
    assert 3500 < waited.value.countdown <= 3600
    assert StageRecord.objects.get(pk=record.pk).attempts == 1
    assert lines(payload["log"]) == ["prepare", f"pay attempt 1 key {job.id}:pay"]


@pytest.mark.django_db
def test_run_eagerly_a_stage_retry_waits_its_countdown_in_the_caller(
    redis_client, make_job, tmp_path, monkeypatch
):
    """CELERY_TASK_ALWAYS_EAGER (a project's tests): Celery runs a retry at once; the task waits
    the countdown itself instead of finding the retry not due, again and again (recursing)."""
    from eventbus.tasks import run_job

    stages = list(FlakyJob.stages)
    stages[1] = Stage("pay", "Paying", retries=3, retry_on=(ConnectionError,), backoff=1)
    monkeypatch.setattr(FlakyJob, "stages", tuple(stages))
    payload = flaky_payload(tmp_path)
    outside_api_down(payload["api"], 2)
    job = make_job("flaky", payload)
    result = run_job.apply((str(job.id),))
    assert result.get() == State.COMPLETED
    assert StageRecord.objects.get(job=job, stage="pay").attempts == 3


@pytest.mark.django_db
def test_a_job_waiting_for_a_retry_is_not_a_lost_run_until_the_retry_is_due(broker, make_job, settings):
    settings.EVENTBUS = {**settings.EVENTBUS, "RECOVER_AFTER": 60}
    quiet = timezone.now() - timedelta(seconds=120)
    waiting = make_job(state=State.RUNNING, enqueued_at=quiet)
    StageRecord.objects.create(
        job=waiting, stage="pay", started_at=quiet, next_attempt_at=timezone.now() + timedelta(hours=1)
    )
    assert recovery.recover_stranded() == 0
    StageRecord.objects.filter(job=waiting).update(next_attempt_at=quiet)  # due long ago: lost
    assert recovery.recover_stranded() == 1
    assert queued_task_ids(broker) == [str(waiting.id)]


# Cancel ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # on_commit runs
def test_a_job_cancelled_before_it_started_never_starts(redis_client, make_job, tmp_path):
    job = make_job("flaky", flaky_payload(tmp_path))
    cancelled = cancel_job(job.id)
    assert cancelled.state == State.CANCELLED and cancelled.cancel_requested_at is not None
    assert runs.run(str(job.id)) == "skipped"
    assert job_events(redis_client, "flaky", job.id) == [("done", FlakyJob.final_seq())]
    assert finals(redis_client, job.id)[0]["state"] == "CANCELLED"
    assert not StageRecord.objects.filter(job=job).exists()
    with pytest.raises(JobEnded):
        cancel_job(job.id)


@pytest.mark.django_db(transaction=True)  # on_commit runs
def test_cancelling_a_job_that_waits_for_a_retry_ends_it_without_waiting(broker, make_job, tmp_path):
    payload = flaky_payload(tmp_path)
    outside_api_down(payload["api"], 1)
    job = make_job("flaky", payload)
    with pytest.raises(StageRetry):
        runs.run(str(job.id))
    StageRecord.objects.filter(job=job).update(next_attempt_at=timezone.now() + timedelta(hours=1))
    cancel_job(job.id)
    assert queued_task_ids(broker) == [str(job.id)]  # a run now, not in an hour
    assert runs.run(str(job.id)) == State.CANCELLED
    record = StageRecord.objects.get(job=job, stage="pay")
    assert (record.attempts, record.next_attempt_at) == (1, None)
    assert [f["state"] for f in finals(broker, job.id)] == ["CANCELLED"]


@pytest.mark.django_db(transaction=True)  # on_commit runs
def test_cancelling_a_running_job_sends_a_run_only_when_none_is_live(broker, make_job, tmp_path):
    live = make_job("flaky", flaky_payload(tmp_path), state=State.RUNNING)
    lease = runs.RunLease(live)
    assert lease.acquire()
    try:
        assert cancel_job(live.id).cancel_requested_at is not None
        assert queued_task_ids(broker) == []  # its run sees the cancel itself
    finally:
        lease.release()
    lost = make_job("flaky", flaky_payload(tmp_path), state=State.RUNNING)
    cancel_job(lost.id)
    assert queued_task_ids(broker) == [str(lost.id)]  # a run now, not when the recovery finds it
    assert runs.run(str(lost.id)) == State.CANCELLED
    assert [f["state"] for f in finals(broker, lost.id)] == ["CANCELLED"]


@pytest.mark.django_db(transaction=True)  # on_commit runs
def test_the_recovery_leaves_a_job_cancelled_meanwhile_to_its_cancel(redis_client, make_job, tmp_path):
    """A stranded PENDING job past its deadline, cancelled as the recovery reads it: one outcome,
    CANCELLED, and its one final event says so."""
    late = make_job("flaky", flaky_payload(tmp_path), deadline=timezone.now() - timedelta(seconds=1))
    read_by_the_recovery = Job.objects.get(pk=late.pk)
    cancel_job(late.id)
    assert runs.time_out(read_by_the_recovery) == "skipped"
    assert Job.objects.get(pk=late.pk).state == State.CANCELLED
    assert [f["state"] for f in finals(redis_client, late.id)] == ["CANCELLED"]


def test_start_job_refuses_an_owner_without_a_key_space(db):
    from django.contrib.auth.models import AnonymousUser

    with pytest.raises(ValueError, match="saved owner"):
        start_job("flaky", {}, key="k", owner=AnonymousUser())


@pytest.mark.django_db
def test_the_cancel_endpoint(api_client, user, other_user, make_job, django_user_model, broker):
    from rest_framework.test import APIClient

    mine = make_job("flaky", {"log": "/dev/null", "api": "x"})
    response = api_client.post(f"/api/jobs/{mine.id}/cancel/", HTTP_IDEMPOTENCY_KEY="c-1")
    assert response.status_code == 202 and response.json()["state"] == "CANCELLED"
    replay = api_client.post(f"/api/jobs/{mine.id}/cancel/", HTTP_IDEMPOTENCY_KEY="c-1")
    assert replay.status_code == 202 and replay["Idempotent-Replayed"] == "true"
    ended = api_client.post(f"/api/jobs/{mine.id}/cancel/")
    assert ended.status_code == 409 and ended.json()["status"] == 409 and "ended" in ended.json()["detail"]

    theirs = Job.objects.create(
        scope="-:x", idem_key="k", owner=other_user, domain="flaky", event_type="job.requested"
    )
    assert api_client.post(f"/api/jobs/{theirs.id}/cancel/").status_code == 404
    assert api_client.post(f"/api/jobs/{uuid.uuid4()}/cancel/").status_code == 404
    viewer = django_user_model.objects.create_user("viewer")
    from django.contrib.auth.models import Permission

    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    client = APIClient()
    client.force_authenticate(viewer)
    refused = client.post(f"/api/jobs/{theirs.id}/cancel/")
    assert refused.status_code == 403 and refused["Content-Type"] == "application/problem+json"
    assert Job.objects.get(pk=theirs.pk).state == State.PENDING


# Retry a job ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_retry_of_a_retry_keeps_the_first_jobs_keys(redis_client, make_job, tmp_path, user):
    payload = flaky_payload(tmp_path)
    outside_api_down(payload["api"], 100)
    first = make_job("flaky", payload)
    assert run_to_end(first.id) == State.FAILED
    second, created = retry_job(first.id, key="r1")
    assert created and second.retry_of_id == first.id and second.owner == user
    assert run_to_end(second.id) == State.FAILED
    outside_api_down(payload["api"], 0)
    third, _ = retry_job(second.id, key="r2")
    assert run_to_end(third.id) == State.COMPLETED

    key = f"{first.id}:pay"
    assert set(outside_api_calls(payload["api"])) == {key}
    assert outside_api_charges(payload["api"]) == {key: 1}
    assert lines(payload["log"]).count("prepare") == 1
    assert [Job.objects.get(pk=o.pk).state for o in (first, second, third)] == [
        State.FAILED,
        State.FAILED,
        State.COMPLETED,
    ]
    # The same key again: the same job; for another job, a mismatch.
    assert retry_job(second.id, key="r2") == (third, False)
    with pytest.raises(IdempotencyKeyMismatch):
        retry_job(first.id, key="r2")


@pytest.mark.django_db
def test_only_a_job_that_did_not_complete_is_retried(api_client, make_job, tmp_path):
    for state in (State.PENDING, State.RUNNING, State.COMPLETED):
        job = make_job("flaky", flaky_payload(tmp_path), state=state)
        with pytest.raises(JobNotRetryable):
            retry_job(job.id, key="r")
        response = api_client.post(f"/api/jobs/{job.id}/retry/", HTTP_IDEMPOTENCY_KEY=f"r-{state}")
        assert response.status_code == 409 and response["Content-Type"] == "application/problem+json"
    failed = make_job("flaky", flaky_payload(tmp_path), state=State.FAILED)
    assert api_client.post(f"/api/jobs/{failed.id}/retry/").status_code == 400  # a key is required
    assert Job.objects.filter(retry_of=failed).count() == 0


@pytest.mark.django_db(transaction=True)  # on_commit runs
def test_retry_jobs_retries_each_job_once(broker, make_job, tmp_path):
    now = timezone.now()
    failed = [
        make_job("flaky", flaky_payload(tmp_path), state=State.FAILED, completed_at=now) for _ in range(2)
    ]
    make_job("flaky", flaky_payload(tmp_path), state=State.COMPLETED, completed_at=now)
    make_job("scan", state=State.FAILED, completed_at=now)
    make_job("flaky", flaky_payload(tmp_path), state=State.FAILED, completed_at=now - timedelta(hours=3))

    def command(*args):
        out = io.StringIO()
        call_command("retry_jobs", "--domain", "flaky", "--since", "2h", *args, stdout=out)
        return out.getvalue()

    dry = command("--dry-run")
    assert all(f"would retry {job.id}" in dry for job in failed) and "would retry 2 of 2" in dry
    assert not Job.objects.filter(retry_of__isnull=False).exists()
    done = command()
    assert "retried 2 of 2" in done
    new = Job.objects.filter(retry_of__isnull=False)
    assert sorted(str(o.retry_of_id) for o in new) == sorted(str(o.id) for o in failed)
    assert {o.idem_key for o in new} == {f"retry:{o.id}" for o in failed}
    assert sorted(queued_task_ids(broker)) == sorted(str(o.id) for o in new)
    assert "retried 0 of 0" in command()  # each job retried once
    assert Job.objects.filter(retry_of__isnull=False).count() == 2


# start_job -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_start_job_and_the_jobs_api_share_the_owners_keys(broker, api_client, user, tmp_path):
    payload = flaky_payload(tmp_path)
    job, created = start_job("flaky", payload, key="order-1", owner=user)
    assert created and job.state == State.PENDING and job.owner == user
    assert start_job(FlakyJob, payload, key="order-1", owner=user) == (job, False)
    posted = api_client.post(
        "/api/jobs/", {"domain": "flaky", "payload": payload}, format="json", HTTP_IDEMPOTENCY_KEY="order-1"
    )
    assert posted.status_code == 201 and posted.json()["job_id"] == str(job.id)
    with pytest.raises(IdempotencyKeyMismatch):
        start_job("flaky", {**payload, "wait": 1}, key="order-1", owner=user)
    with pytest.raises(UnknownJobType):
        start_job("nope", {}, key="k", owner=user)
    with pytest.raises(InvalidPayload):
        start_job("chat", {"prompt": 3}, key="k", owner=user)
    later, _ = start_job("flaky", payload, key="order-2", owner=user, deadline=timedelta(minutes=5))
    assert later.deadline > timezone.now()


@pytest.mark.django_db
def test_the_running_cap_of_eventbus_limits_refuses_new_jobs_not_replays(
    broker, api_client, user, tmp_path, monkeypatch
):
    """eventbus.job.limits's cap refuses a new job (429 with Retry-After), never a replay: a
    refusal asks whether the key was accepted before (not asked on every first request)."""
    from eventbus.exceptions import JobLimitReached
    from eventbus.job import accepting

    capped = []

    def check_running_cap(owner):
        capped.append(owner)
        if len(capped) > 1:
            raise JobLimitReached(retry_after=7)

    monkeypatch.setattr(accepting, "check_running_cap", check_running_cap)
    payload = flaky_payload(tmp_path)
    body = {"domain": "flaky", "payload": payload}
    first = api_client.post("/api/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="cap-1")
    assert first.status_code == 201
    refused = api_client.post("/api/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="cap-2")
    assert refused.status_code == 429 and refused["Retry-After"] == "7"
    assert refused["Content-Type"] == "application/problem+json" and refused.json()["status"] == 429
    assert start_job("flaky", payload, key="cap-1", owner=user)[1] is False  # a replay: not capped
    assert capped == [user, user, user] and Job.objects.count() == 1


# Races, with real threads (PostgreSQL in CI) --------------------------------------------------

THREADS = 50


@pytest.mark.django_db(transaction=True)
def test_50_threads_start_one_key_one_job_one_task(broker, user, tmp_path):
    payload = flaky_payload(tmp_path)
    results = in_threads(THREADS, lambda _: start_job("flaky", payload, key="race", owner=user))
    assert len({job.id for job, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert Job.objects.count() == 1
    assert queued_task_ids(broker) == [str(results[0][0].id)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("started", [False, True], ids=["racing-the-start", "racing-the-end"])
def test_cancels_racing_a_run_end_in_one_state_with_one_final_event(
    redis_client, make_job, tmp_path, started
):
    """A short job runs in one thread while others cancel it until it has ended (from its start,
    or from the moment its last stage runs): it ends once, COMPLETED or CANCELLED, and its one
    final event says the state the database holds."""
    outcomes = []
    for _ in range(5):
        payload = flaky_payload(tmp_path)
        outside_api_down(payload["api"], 0)
        job = make_job("flaky", payload, state=State.RUNNING if started else State.PENDING)
        job_id = str(job.id)

        def work(i, job_id=job_id, payload=payload):
            if i == 0:
                return run_to_end(job_id)
            if started:  # cancel as the last stage runs: the run's end is at hand
                wait_for(lambda: "finish" in lines(payload["log"]), timeout=30, interval=0.001)
            for _ in range(200):
                try:
                    cancel_job(job_id)
                except JobEnded:
                    return "ended"
            return "cancelling"

        results = in_threads(12, work)
        state = Job.objects.get(pk=job_id).state
        assert state in (State.COMPLETED, State.CANCELLED), results
        assert results[0] in (state, "skipped"), results
        final = finals(redis_client, job_id)
        assert [f["state"] for f in final] == [state], (final, results)
        events = job_events(redis_client, "flaky", job_id)
        assert [seq for _, seq in events] == sorted({seq for _, seq in events})
        outcomes.append(state)
    assert set(outcomes) <= {State.COMPLETED, State.CANCELLED}
