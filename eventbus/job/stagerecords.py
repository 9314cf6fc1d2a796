"""The writes of a job's stage records, each one statement: the only module that writes a
StageRecord (as eventbus.job.lifecycle is for a job's state; tests/eventbus/test_writers.py checks
it). A run's stages (eventbus.job.stages) save their start and finish and record their failures
here, the end of a run clears a waiting retry, and a retried job's finished stages are copied
here (eventbus.services.retry_job).

A run writes a stage's start and its finish, and a finished stage costs one write (the README's Measured table): the
finish of a stage also starts the next one (its attempts, started_at), in the same INSERT ... ON
CONFLICT DO UPDATE of two rows, which also reads whether the job was cancelled meanwhile (a
RETURNING subquery), the run's check before every stage. Only the first stage a run works on is
started on its own.

The conflict's update applies only to a record that is not finished: a run that outlived its
lease never overwrites the result and events another run finished the stage with, nor starts a
finished stage again.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import connections
from django.utils import timezone

from eventbus.models import CANCELLED_ERROR, Job, StageRecord
from exactly_once.upsert import column, insert_statement


def save(records: list[StageRecord]) -> bool:
    """Insert these records, or update the unfinished ones already there, in one statement;
    returns whether their job's cancel was requested (the database's word)."""
    sql, params, alias = insert_statement(records, target=("job", "stage"), update_unless="finished_at")
    connection = connections[alias]
    job_id = records[0].job_id
    with connection.cursor() as cursor:
        if connection.features.can_return_columns_from_insert:
            quote = connection.ops.quote_name
            pk = Job._meta.pk
            assert pk is not None
            cursor.execute(
                f"{sql} RETURNING (SELECT {quote(column(Job, 'cancel_requested_at'))} "
                f"FROM {quote(Job._meta.db_table)} WHERE {quote(column(Job, pk.name))} = %s)",
                [*params, pk.get_db_prep_value(job_id, connection)],
            )
            rows = cursor.fetchall()
            if rows:  # none when every record was finished already (a run that outlived its lease)
                return any(row[0] is not None for row in rows)
        else:
            cursor.execute(sql, params)
    return cancel_requested(job_id)


def finished_as(job, stage: str, finished_at) -> bool:
    """Whether the stage's record is finished with this finish (not another run's)."""
    return StageRecord.objects.filter(job=job, stage=stage, finished_at=finished_at).exists()


def cancel_requested(job_id) -> bool:
    """Whether the job's cancel was requested (the database's word: Redis may have lost the flag)."""
    return Job.objects.filter(pk=job_id, cancel_requested_at__isnull=False).exists()


def record_failure(
    job,
    stage: str,
    *,
    error_type: str,
    error_class: str,
    error_message: str,
    error_traceback: str,
    retry_in: float | None,
) -> None:
    """Keep a failed attempt on the stage's record unless the stage is finished: its error (the
    owner's word and the staff's traceback), when, and when its retry is due (`retry_in`
    seconds from now; None: no retry waits)."""
    now = timezone.now()
    StageRecord.objects.filter(job=job, stage=stage, finished_at__isnull=True).update(
        error_type=error_type,
        error_class=error_class,
        error_message=error_message,
        error_traceback=error_traceback,
        failed_at=now,
        next_attempt_at=None if retry_in is None else now + timedelta(seconds=retry_in),
    )


def record_wait(job, stage: str, *, waits: dict, waiting_for: str) -> None:
    """The stage waits (eventbus.job.waits): what for, and its durable waits as its attempt
    left them, unless the stage is finished."""
    StageRecord.objects.filter(job=job, stage=stage, finished_at__isnull=True).update(
        waits=waits, waiting_for=waiting_for
    )


def forget_wait(job_id, stage: str, *, waits: dict) -> None:
    """A wait of the stage is over without what it waited for (a signal's timeout): its durable
    waits without it, so that another attempt waits afresh."""
    StageRecord.objects.filter(job_id=job_id, stage=stage, finished_at__isnull=True).update(waits=waits)


def cancel_retry_waits(job, *, cancelled: bool = False) -> None:
    """A retry that waited will not come (the job ended): no stage of the job is RETRYING, nor
    WAITING; a stage that waited when the job was cancelled reads CANCELLED."""
    StageRecord.objects.filter(job=job, next_attempt_at__isnull=False).update(next_attempt_at=None)
    waiting = StageRecord.objects.filter(job=job, waiting_for__isnull=False, finished_at__isnull=True)
    if cancelled:
        waiting.update(
            waiting_for=None,
            error_type=CANCELLED_ERROR,
            error_class="eventbus.jobtypes.JobCancelled",
            error_message="The job was cancelled while the stage waited.",
            failed_at=timezone.now(),
        )
    else:
        waiting.update(waiting_for=None)


def copy_finished(old, new) -> None:
    """Give the retry `new` the stages `old` finished (their results and events), which its run
    then skips as any re-run does."""
    StageRecord.objects.bulk_create(
        StageRecord(
            job=new,
            stage=record.stage,
            attempts=record.attempts,
            workers=record.workers,
            result=record.result,
            events=record.events,
            started_at=record.started_at,
            finished_at=record.finished_at,
        )
        for record in old.stage_records.filter(finished_at__isnull=False)
    )
