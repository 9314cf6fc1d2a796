"""Durable stages in process (a real Redis, the test database, runs.run called as the worker
calls it): an atomic stage's rows, a sleep, a signal and children, each WAITING without a run."""

import datetime as dt
from pathlib import Path

import pytest
from django.utils import timezone

from config.models import LedgerEntry
from eventbus.exceptions import JobEnded, SignalAlreadySent, UnknownSignal
from eventbus.job import runs
from eventbus.job.sweep import enqueue_due
from eventbus.models import Job, JobSignal, StageRecord
from eventbus.services import cancel_job, signal_job
from idempotency.exceptions import IdempotencyKeyMismatch

pytestmark = pytest.mark.django_db(transaction=True)
State = Job.State


def lines(path) -> list[str]:
    return Path(path).read_text().splitlines() if Path(path).exists() else []


def run(job) -> str:
    return runs.run(str(job.id), fail_on_transient=False)


def durable(make_job, tmp_path, **payload):
    return make_job("durable", {"log": str(tmp_path / "log"), "skip_review": True, **payload})


def test_an_atomic_stage_writes_its_rows_once_and_none_when_it_fails(redis_client, make_job, tmp_path):
    job = durable(make_job, tmp_path)
    assert run(job) == State.COMPLETED
    assert LedgerEntry.objects.filter(job_id=job.id).count() == 1
    failing = durable(make_job, tmp_path, fail_pay_after_write=True)
    assert run(failing) == State.FAILED
    assert LedgerEntry.objects.filter(job_id=failing.id).count() == 0, (
        "the failed attempt's row was rolled back"
    )
    assert lines(tmp_path / "log").count("pay") == 2  # its code ran; its write did not stay


def test_a_sleep_ends_the_run_waiting_and_resumes_once_due(redis_client, make_job, tmp_path):
    job = durable(make_job, tmp_path, sleep=3600)
    assert run(job) == "waiting"
    job.refresh_from_db()
    assert job.state == State.WAITING and job.enqueued_at is None
    assert job.run_after > timezone.now() + dt.timedelta(minutes=59)
    record = StageRecord.objects.get(job=job, stage="pause")
    assert record.state == "WAITING" and record.waiting_for == "sleep"
    assert run(job) == "waiting", "a run before the due time (a duplicate message) waits again"
    assert lines(tmp_path / "log").count("pause-after") == 0
    # Due now: the sweeper sends it (a message, enqueued_at set), and its run goes past the sleep.
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now() - dt.timedelta(seconds=1))
    StageRecord.objects.filter(pk=record.pk).update(waits={"sleep:1": timezone.now().isoformat()})
    assert run(job) == State.COMPLETED
    assert lines(tmp_path / "log").count("pause-after") == 1
    assert LedgerEntry.objects.filter(job_id=job.id).count() == 1
    record.refresh_from_db()
    assert record.attempts == 1, "a resumption is not another attempt"


def test_the_sweeper_sends_a_due_waiting_job(redis_client, broker, make_job, tmp_path):
    job = durable(make_job, tmp_path, sleep=3600)
    assert run(job) == "waiting"
    assert enqueue_due() == 0
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    assert enqueue_due() == 1
    job.refresh_from_db()
    assert job.enqueued_at is not None and job.state == State.WAITING
    assert enqueue_due() == 0, "sent once"


def test_a_signal_sent_early_is_kept_and_one_key_delivers_it_once(redis_client, make_job, tmp_path):
    job = make_job("durable", {"log": str(tmp_path / "log")})
    sent, created = signal_job(job.id, "approve", {"by": "ann"}, key="k1")
    assert created
    again, created = signal_job(job.id, "approve", {"by": "ann"}, key="k1")
    assert not created and again.pk == sent.pk
    with pytest.raises(SignalAlreadySent):
        signal_job(job.id, "approve", {"by": "bob"}, key="k2")
    with pytest.raises(IdempotencyKeyMismatch):
        signal_job(job.id, "approve", {"by": "eve"}, key="k1")
    with pytest.raises(UnknownSignal):
        signal_job(job.id, "reject", {}, key="k3")
    assert run(job) == State.COMPLETED
    assert lines(tmp_path / "log").count("approved ann") == 1
    assert JobSignal.objects.get(job=job).delivered_at is not None
    ended = durable(make_job, tmp_path)
    assert run(ended) == State.COMPLETED
    with pytest.raises(JobEnded):
        signal_job(ended.id, "approve", {}, key="k4")


def test_a_signal_wakes_a_waiting_job(redis_client, broker, make_job, tmp_path):
    job = make_job("durable", {"log": str(tmp_path / "log")})
    assert run(job) == "waiting"
    job.refresh_from_db()
    assert job.state == State.WAITING and job.run_after is None
    assert StageRecord.objects.get(job=job, stage="review").waiting_for == "signal:approve"
    signal_job(job.id, "approve", {"by": "ann"}, key="k1")
    job.refresh_from_db()
    assert job.run_after is not None and job.enqueued_at is not None, "woken, its run sent"
    assert run(job) == State.COMPLETED
    assert lines(tmp_path / "log").count("approved ann") == 1


def test_a_signal_that_never_comes_times_out(redis_client, make_job, tmp_path):
    job = make_job("durable", {"log": str(tmp_path / "log"), "review_timeout": 3600})
    assert run(job) == "waiting"
    job.refresh_from_db()
    assert job.run_after > timezone.now() + dt.timedelta(minutes=59)
    record = StageRecord.objects.get(job=job, stage="review")
    StageRecord.objects.filter(pk=record.pk).update(waits={"signal:approve": timezone.now().isoformat()})
    assert run(job) == State.FAILED
    record.refresh_from_db()
    assert record.error_type == "StageTimeout"


def test_a_cancel_ends_the_wait_at_once(redis_client, make_job, tmp_path):
    job = durable(make_job, tmp_path, sleep=3600)
    assert run(job) == "waiting"
    cancel_job(job.id)
    job.refresh_from_db()
    assert job.state == State.CANCELLED
    assert StageRecord.objects.get(job=job, stage="pause").state == "CANCELLED"
    assert run(job) == "skipped"


def test_children_start_once_and_the_parent_resumes_when_they_end(redis_client, make_job, tmp_path):
    job = durable(make_job, tmp_path, children=2)
    assert run(job) == "waiting"
    children = list(Job.objects.filter(parent=job).order_by("accepted_at"))
    assert len(children) == 2 and all(c.domain == "staged" and c.owner_id == job.owner_id for c in children)
    assert run(job) == "waiting", "a re-run starts no new child"
    assert Job.objects.filter(parent=job).count() == 2
    for child in children:
        assert run(child) == State.COMPLETED
    job.refresh_from_db()
    assert job.state == State.WAITING and job.run_after is not None, "the last child's end woke it"
    assert run(job) == State.COMPLETED
    fan_out = StageRecord.objects.get(job=job, stage="fan_out")
    assert fan_out.result == {"children": ["COMPLETED", "COMPLETED"]}


def test_cancelling_a_parent_cancels_its_children(redis_client, make_job, tmp_path):
    job = durable(make_job, tmp_path, children=2)
    assert run(job) == "waiting"
    cancel_job(job.id)
    assert set(Job.objects.filter(parent=job).values_list("state", flat=True)) == {State.CANCELLED}
