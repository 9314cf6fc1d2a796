"""A stage stopped by a cancel reads CANCELLED wherever a stage's state is told (the stage
record, the jobs API's detail, the admin's timeline), never FAILED; a cancelled job has no
`error`. Real Redis and database: the runs are eventbus.job.runs's and eventbus.job.stages's own."""

from datetime import timedelta

import pytest
from django.utils import timezone

from eventbus.job import runs
from eventbus.job.stages import StageRetry, run_stages
from eventbus.jobtypes import JobCancelled, job_type
from eventbus.models import STAGE_STATES, Job, StageRecord
from eventbus.services import cancel_job

from .jobtypes import flaky_payload, outside_api_down
from .test_admin import JOBS, staff

State = Job.State


def timeline_states(client, job) -> dict:
    """{stage: state} as the admin's timeline shows them."""
    html = client.get(f"{JOBS}{job.pk}/change/").content.decode()
    start = html.index("<th>next attempt</th>")
    rows = html[start : html.index("</table>", start)].split("<tr>")[1:]
    return {row.split("</td><td>")[1]: row.split("</td><td>")[2] for row in rows}


@pytest.mark.django_db(transaction=True)  # on_commit runs
def test_the_stage_a_cancel_stopped_is_cancelled_in_the_api_and_the_admin(
    broker, make_job, tmp_path, api_client, django_user_model
):
    payload = flaky_payload(tmp_path)
    outside_api_down(payload["api"], 1)
    job = make_job("flaky", payload)
    with pytest.raises(StageRetry):
        runs.run(str(job.id))
    StageRecord.objects.filter(job=job).update(next_attempt_at=timezone.now() + timedelta(hours=1))
    cancel_job(job.id)
    assert runs.run(str(job.id)) == State.CANCELLED
    assert StageRecord.objects.get(job=job, stage="pay").state == "CANCELLED"

    detail = api_client.get(f"/api/jobs/{job.id}/").json()
    assert (detail["state"], detail["error"]) == ("CANCELLED", None)
    stages = {stage["name"]: stage for stage in detail["stages"]}
    assert (stages["prepare"]["state"], stages["wait"]["state"]) == ("COMPLETED", "PENDING")
    assert (stages["pay"]["state"], stages["pay"]["error"]) == ("CANCELLED", None)

    viewer = staff(django_user_model, "viewer", "view_job")
    states = timeline_states(viewer, job)
    assert states["Paying (pay)"] == "CANCELLED" and "FAILED" not in states.values()


@pytest.mark.django_db
def test_a_stage_that_fails_as_its_job_is_cancelled_is_cancelled_with_its_failure_as_the_cause(
    redis_client, make_job, tmp_path
):
    """The stage raises (not at a report) while the job's cancel is requested: the run stops as
    cancelled, and the record says so, the stage's own exception kept as the traceback's cause."""
    job = make_job("staged", {"log": str(tmp_path / "log"), "raise": "broken by the cancel"})

    def cancelled_once_first_is_done():  # the second stage raises before it reports
        return StageRecord.objects.filter(job=job, stage="first", finished_at__isnull=False).exists()

    with pytest.raises(JobCancelled):
        run_stages(
            job, job_type("staged")(), after_event=lambda: None, is_cancelled=cancelled_once_first_is_done
        )
    record = StageRecord.objects.get(job=job, stage="second")
    assert (record.state, record.error_type) == ("CANCELLED", "JobCancelled")
    assert "ValueError: broken by the cancel" in record.error_traceback


def test_a_failed_attempt_is_failed_and_a_cancelled_one_cancelled():
    now = timezone.now()
    failed = StageRecord(stage="pay", started_at=now, failed_at=now, error_type="ValueError")
    cancelled = StageRecord(stage="pay", started_at=now, failed_at=now, error_type="JobCancelled")
    assert (failed.state, cancelled.state) == ("FAILED", "CANCELLED")
    assert str(cancelled).endswith("pay (cancelled)") and str(failed).endswith("pay (failed)")
    assert "CANCELLED" in STAGE_STATES  # what the API's schema offers
