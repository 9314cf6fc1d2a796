"""No accepted job stays stranded: the recovery enqueues again a job whose run was lost, and
times out one past its deadline (real Redis broker, real database; the worker's side, resuming
from stage records, is in test_jobtypes.py and test_tasks_worker.py)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from eventbus.job import recovery
from eventbus.job.runs import RunLease
from eventbus.models import Job, StageRecord

from .helpers import job_events, queued_task_ids

pytestmark = pytest.mark.django_db
State = Job.State


@pytest.fixture
def quiet(settings):
    settings.EVENTBUS = {**settings.EVENTBUS, "RECOVER_AFTER": 60}
    return timezone.now() - timedelta(seconds=120)  # longer ago than RECOVER_AFTER


def test_a_running_job_with_no_lease_and_no_sign_of_life_is_enqueued_again(broker, make_job, quiet):
    lost = make_job(state=State.RUNNING, enqueued_at=quiet)
    StageRecord.objects.create(job=lost, stage="vision", started_at=quiet, finished_at=quiet)
    assert recovery.recover_stranded() == 1
    assert queued_task_ids(broker) == [str(lost.id)]
    lost.refresh_from_db()
    assert lost.enqueued_at > quiet  # the new message is its sign of life: not sent again at once
    assert recovery.recover_stranded() == 0


def test_jobs_with_a_sign_of_life_are_left_alone(broker, make_job, quiet):
    recent_stage = make_job(state=State.RUNNING, enqueued_at=quiet)
    StageRecord.objects.create(job=recent_stage, stage="vision", started_at=timezone.now())
    make_job(enqueued_at=timezone.now())  # recently enqueued
    leased = make_job(state=State.RUNNING, enqueued_at=quiet)
    lease = RunLease(leased)
    assert lease.acquire()
    never_enqueued = make_job()  # the sweep's other half sends these
    finished = make_job(state=State.COMPLETED, enqueued_at=quiet)
    try:
        assert recovery.recover_stranded() == 0
    finally:
        lease.release()
    assert queued_task_ids(broker) == []
    assert Job.objects.get(pk=finished.pk).state == State.COMPLETED
    assert Job.objects.get(pk=never_enqueued.pk).enqueued_at is None


def test_a_stranded_job_past_its_deadline_times_out_with_its_final_event(broker, make_job, quiet):
    late = make_job(state=State.RUNNING, enqueued_at=quiet, deadline=timezone.now() - timedelta(seconds=1))
    assert recovery.recover_stranded() == 1
    assert Job.objects.get(pk=late.pk).state == State.TIMED_OUT
    assert job_events(broker, "scan", late.id) == [("done", 51)]
    assert queued_task_ids(broker) == []


def test_the_sweep_command_recovers_lost_runs(broker, make_job, quiet):
    from django.core.management import call_command

    lost = make_job(state=State.RUNNING, enqueued_at=quiet)
    call_command("sweep_jobs", burst=True, older_than=0)
    assert queued_task_ids(broker) == [str(lost.id)]
