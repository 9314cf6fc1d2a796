"""A finished stage costs one database write (SPEC §9): counted, statement by statement, on
every database the suite runs on. The finish of a stage starts the next in the same statement;
only the first stage a run works on is started by a write of its own."""

import re

import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext

from eventbus import jobs, stagerecords
from eventbus.models import StageRecord
from idempotency.models import Operation

from .jobtypes import StagedJob

WRITE = re.compile(r'^\s*(INSERT INTO|UPDATE|DELETE FROM)\s+"?(\w+)"?', re.IGNORECASE)


def writes(queries) -> list[str]:
    """The tables written, one entry per statement, in order."""
    return [m.group(2) for q in queries if (m := WRITE.match(q["sql"]))]


def run_counted(operation, statements: list | None = None) -> tuple[str, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        outcome = jobs.run(str(operation.op_id), fail_on_transient=False)
    if statements is not None:
        statements += [q["sql"] for q in queries.captured_queries]
    return outcome, writes(queries.captured_queries)


STAGES = StageRecord._meta.db_table
OPERATIONS = Operation._meta.db_table


@pytest.mark.django_db(transaction=True)
def test_four_stages_cost_one_write_each_and_the_first_start(redis_client, make_operation):
    operation = make_operation("scan")
    statements: list[str] = []
    outcome, written = run_counted(operation, statements)
    assert outcome == Operation.State.COMPLETED
    # The job's start and end (its Operation), the first stage's start, one write per finished stage.
    assert written == [OPERATIONS, STAGES, STAGES, STAGES, STAGES, STAGES, OPERATIONS]
    # Besides them, the run reads the job and its stage records once; the check for a cancel
    # before each stage rides on the write that starts it (where the database can RETURNING).
    if connection.features.can_return_columns_from_insert:
        assert len(statements) == len(written) + 2, statements
    records = StageRecord.objects.filter(operation=operation).order_by("started_at")
    assert [(r.stage, r.attempts, r.finished) for r in records] == [
        ("vision", 1, True),
        ("rule", 1, True),
        ("answer", 1, True),
        ("reward", 1, True),
    ]
    assert all(r.started_at <= r.finished_at for r in records)


@pytest.mark.django_db(transaction=True)
def test_a_rerun_starts_the_stage_in_flight_and_writes_once_per_stage_it_finishes(
    redis_client, make_operation, tmp_path, monkeypatch
):
    operation = make_operation("staged", {"log": str(tmp_path / "log")})
    real_third = StagedJob.third

    def crash_once(self, ctx):
        if ctx.attempt == 1:
            raise redis.ConnectionError("Redis went away")
        return real_third(self, ctx)

    monkeypatch.setattr(StagedJob, "third", crash_once)
    with pytest.raises(redis.ConnectionError):
        run_counted(operation)
    # While the third stage ran, its record said so (started by the second's finish).
    third = StageRecord.objects.get(operation=operation, stage="third")
    assert (third.attempts, third.finished) == (1, False)
    outcome, written = run_counted(operation)
    assert outcome == Operation.State.COMPLETED
    # The run's start (the job's), the third stage started again (attempt 2) and finished: one
    # write each; the job's end.
    assert written == [OPERATIONS, STAGES, STAGES, OPERATIONS]
    third.refresh_from_db()
    assert (third.attempts, third.finished) == (2, True)


@pytest.mark.django_db(transaction=True)
def test_a_finish_never_overwrites_a_stage_another_run_finished(make_operation):
    operation = make_operation("scan")
    done = StageRecord.objects.create(
        operation=operation, stage="vision", attempts=1, result={"by": "the run that finished it"}
    )
    StageRecord.objects.filter(pk=done.pk).update(finished_at=done.started_at)
    stale = StageRecord(operation=operation, stage="vision", attempts=1, result={"by": "a stale run"})
    stale.finished_at = stale.started_at
    stagerecords.save([stale, StageRecord(operation=operation, stage="rule", attempts=1)])
    done.refresh_from_db()
    assert done.result == {"by": "the run that finished it"}
    assert StageRecord.objects.get(operation=operation, stage="rule").attempts == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("returning", [True, False])
def test_a_stage_write_reports_the_jobs_cancel_with_or_without_returning(
    make_operation, monkeypatch, returning
):
    """Where the database has no RETURNING (SQLite before 3.35), the write is followed by a read."""
    monkeypatch.setattr(connection.features, "can_return_columns_from_insert", returning)
    operation = make_operation("scan")
    assert stagerecords.save([StageRecord(operation=operation, stage="vision", attempts=1)]) is False
    Operation.objects.filter(pk=operation.pk).update(cancel_requested_at=operation.accepted_at)
    with CaptureQueriesContext(connection) as queries:
        assert stagerecords.save([StageRecord(operation=operation, stage="rule", attempts=1)]) is True
    assert len(queries) == (1 if returning else 2)
