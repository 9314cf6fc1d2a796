"""Ended jobs are deleted after EVENTBUS["KEEP_ENDED_JOBS"] (eventbus.job.retention, `cleanup_jobs`),
with their stage records; PENDING and RUNNING jobs never are."""

import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from eventbus.job.retention import delete_ended_jobs
from eventbus.models import Job, StageRecord

DAY = timedelta(days=1)


def job(state, *, ended_days_ago: float | None, stages: int = 2) -> Job:
    job = Job.objects.create(
        scope="user:1",
        idem_key=uuid.uuid4().hex,
        domain="scan",
        event_type="scan",
        state=state,
        accepted_at=timezone.now() - 90 * DAY,
        completed_at=None if ended_days_ago is None else timezone.now() - ended_days_ago * DAY,
    )
    for index in range(stages):
        StageRecord.objects.create(job=job, stage=f"stage-{index}", attempts=1)
    return job


def cleanup(*args: str) -> str:
    out = StringIO()
    call_command("cleanup_jobs", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def jobs(db):
    old = [job(state, ended_days_ago=31) for state in Job.FINAL_STATES]
    kept = [
        job(Job.State.COMPLETED, ended_days_ago=29),  # ended within the 30 days
        job(Job.State.FAILED, ended_days_ago=None),  # no end time: its age is unknown
        # Not ended, whatever completed_at says (a row written by hand, a bug elsewhere).
        job(Job.State.PENDING, ended_days_ago=60),
        job(Job.State.RUNNING, ended_days_ago=60),
    ]
    return old, kept


def test_cleanup_jobs_deletes_ended_jobs_past_the_setting_with_their_stage_records(jobs):
    old, kept = jobs
    out = cleanup()
    assert f"Deleted {len(old)} ended job(s) and {2 * len(old)} stage record(s)" in out
    assert set(Job.objects.values_list("pk", flat=True)) == {j.pk for j in kept}
    assert set(StageRecord.objects.values_list("job_id", flat=True)) == {j.pk for j in kept}
    assert "Deleted 0 ended job(s)" in cleanup()  # nothing left to delete


def test_dry_run_counts_and_deletes_nothing(jobs):
    old, kept = jobs
    out = cleanup("--dry-run")
    assert f"Would delete {len(old)} ended job(s) and {2 * len(old)} stage record(s)" in out
    assert Job.objects.count() == len(old) + len(kept)
    assert StageRecord.objects.count() == 2 * (len(old) + len(kept))


def test_the_setting_sets_the_age(jobs, settings):
    old, kept = jobs
    settings.EVENTBUS = {**settings.EVENTBUS, "KEEP_ENDED_JOBS": 7 * 24 * 3600}
    assert f"Deleted {len(old) + 1} ended job(s)" in cleanup()  # the one of 29 days too
    states = set(Job.objects.values_list("state", flat=True))
    assert states == {Job.State.FAILED, Job.State.PENDING, Job.State.RUNNING}

    settings.EVENTBUS = {**settings.EVENTBUS, "KEEP_ENDED_JOBS": 3600}  # under IDEMPOTENCY["TTL"]
    err = StringIO()
    call_command("cleanup_jobs", "--dry-run", stdout=StringIO(), stderr=err)
    assert "shorter than IDEMPOTENCY['TTL']" in err.getvalue()

    settings.EVENTBUS = {**settings.EVENTBUS, "KEEP_ENDED_JOBS": None}
    assert "kept for ever" in cleanup()
    settings.EVENTBUS = {**settings.EVENTBUS, "KEEP_ENDED_JOBS": "30d"}
    with pytest.raises(CommandError, match="KEEP_ENDED_JOBS"):
        cleanup()


def test_jobs_are_deleted_in_batches(db):
    old = [job(Job.State.COMPLETED, ended_days_ago=40, stages=1) for _ in range(5)]
    running = job(Job.State.RUNNING, ended_days_ago=None)
    deleted = delete_ended_jobs(older_than=30 * DAY, batch_size=2)
    assert (deleted.jobs, deleted.stage_records) == (len(old), len(old))
    assert list(Job.objects.values_list("pk", flat=True)) == [running.pk]
