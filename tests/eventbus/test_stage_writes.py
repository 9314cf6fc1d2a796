"""A finished stage costs one database write (the README's Measured table): counted, statement by statement, on
every database the suite runs on. The finish of a stage starts the next in the same statement;
only the first stage a run works on is started by a write of its own."""

import re

import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext

from eventbus.job import runs, stagerecords
from eventbus.models import Job, StageRecord

from .jobtypes import StagedJob

WRITE = re.compile(r'^\s*(INSERT INTO|UPDATE|DELETE FROM)\s+"?(\w+)"?', re.IGNORECASE)


def writes(queries) -> list[str]:
    """The tables written, one entry per statement, in order."""
    return [m.group(2) for q in queries if (m := WRITE.match(q["sql"]))]


def run_counted(job, statements: list | None = None) -> tuple[str, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        outcome = runs.run(str(job.id), fail_on_transient=False)
    if statements is not None:
        statements += [q["sql"] for q in queries.captured_queries]
    return outcome, writes(queries.captured_queries)


STAGES = StageRecord._meta.db_table
OPERATIONS = Job._meta.db_table


@pytest.mark.django_db(transaction=True)
def test_four_stages_cost_one_write_each_and_the_first_start(redis_client, make_job):
    job = make_job("scan")
    statements: list[str] = []
    outcome, written = run_counted(job, statements)
    assert outcome == Job.State.COMPLETED
    # The job's start and end (its Job), the first stage's start, one write per finished stage.
    assert written == [OPERATIONS, STAGES, STAGES, STAGES, STAGES, STAGES, OPERATIONS]
    # Besides them, the run reads the job once (a first run, which took the job from PENDING,
    # has no stage record to read); the check for a cancel before each stage rides on the write
    # that starts it (where the database can RETURNING).
    if connection.features.can_return_columns_from_insert:
        assert len(statements) == len(written) + 1, statements
    records = StageRecord.objects.filter(job=job).order_by("started_at")
    assert [(r.stage, r.attempts, r.finished) for r in records] == [
        ("vision", 1, True),
        ("rule", 1, True),
        ("answer", 1, True),
        ("reward", 1, True),
    ]
    assert all(r.started_at <= r.finished_at for r in records)


@pytest.mark.django_db(transaction=True)
def test_a_rerun_starts_the_stage_in_flight_and_writes_once_per_stage_it_finishes(
    redis_client, make_job, tmp_path, monkeypatch
):
    job = make_job("staged", {"log": str(tmp_path / "log")})
    real_third = StagedJob.third

    def crash_once(self, ctx):
        if ctx.attempt == 1:
            raise redis.ConnectionError("Redis went away")
        return real_third(self, ctx)

    monkeypatch.setattr(StagedJob, "third", crash_once)
    with pytest.raises(redis.ConnectionError):
        run_counted(job)
    # While the third stage ran, its record said so (started by the second's finish).
    third = StageRecord.objects.get(job=job, stage="third")
    assert (third.attempts, third.finished) == (1, False)
    outcome, written = run_counted(job)
    assert outcome == Job.State.COMPLETED
    # The run's start (the job's), the third stage started again (attempt 2) and finished: one
    # write each; the job's end.
    assert written == [OPERATIONS, STAGES, STAGES, OPERATIONS]
    third.refresh_from_db()
    assert (third.attempts, third.finished) == (2, True)


@pytest.mark.django_db(transaction=True)
def test_a_finish_never_overwrites_a_stage_another_run_finished(make_job):
    job = make_job("scan")
    done = StageRecord.objects.create(
        job=job, stage="vision", attempts=1, result={"by": "the run that finished it"}
    )
    StageRecord.objects.filter(pk=done.pk).update(finished_at=done.started_at)
    stale = StageRecord(job=job, stage="vision", attempts=1, result={"by": "a stale run"})
    stale.finished_at = stale.started_at
    stagerecords.save([stale, StageRecord(job=job, stage="rule", attempts=1)])
    done.refresh_from_db()
    assert done.result == {"by": "the run that finished it"}
    assert StageRecord.objects.get(job=job, stage="rule").attempts == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("returning", [True, False])
def test_a_stage_write_reports_the_jobs_cancel_with_or_without_returning(make_job, monkeypatch, returning):
    """Where the database has no RETURNING (SQLite before 3.35), the write is followed by a read."""
    monkeypatch.setattr(connection.features, "can_return_columns_from_insert", returning)
    job = make_job("scan")
    assert stagerecords.save([StageRecord(job=job, stage="vision", attempts=1)]) is False
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=job.accepted_at)
    with CaptureQueriesContext(connection) as queries:
        assert stagerecords.save([StageRecord(job=job, stage="rule", attempts=1)]) is True
    assert len(queries) == (1 if returning else 2)
