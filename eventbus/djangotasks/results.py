"""A task's TaskResult, read from its job (Job and the StageRecord of its `run` stage), from any
process: what get_result() and refresh() answer, and what the signals carry."""

from __future__ import annotations

import traceback
import uuid
from dataclasses import replace
from typing import Any

from django.utils import timezone

from eventbus.models import Job, StageRecord

from . import compat
from .names import RUN_STAGE, TASK_JOB, load_task

Status = compat.TaskResultStatus
# A job's state as a task's status (django.tasks has four): an ended job that did not complete
# (FAILED, TIMED_OUT, CANCELLED) is a FAILED task, its error naming why.
STATUS: dict[str, Any] = {
    Job.State.PENDING: Status.READY,
    Job.State.RUNNING: Status.RUNNING,
    # A task's stage never waits (it has no ctx.sleep), but a job that does is ready to run again.
    Job.State.WAITING: Status.READY,
    Job.State.COMPLETED: Status.SUCCESSFUL,
    Job.State.FAILED: Status.FAILED,
    Job.State.TIMED_OUT: Status.FAILED,
    Job.State.CANCELLED: Status.FAILED,
}
# The error of an ended task whose stage recorded none (it never started, or the job's deadline
# or cancel ended it between attempts).
ENDED_WITHOUT_ERROR: dict[str, str] = {
    Job.State.TIMED_OUT: "eventbus.job.stages.DeadlinePassed",
    Job.State.CANCELLED: "eventbus.jobtypes.JobCancelled",
    Job.State.FAILED: "eventbus.jobtypes.JobFailed",
}


def task_job(result_id) -> Job:
    """The job of a task's result id; TaskResultDoesNotExist for any other id."""
    try:
        job_id = uuid.UUID(str(result_id))
    except (ValueError, TypeError, AttributeError):
        raise compat.TaskResultDoesNotExist(f"No task result {result_id!r}") from None
    job = Job.objects.filter(pk=job_id, domain=TASK_JOB).first()
    if job is None:
        raise compat.TaskResultDoesNotExist(f"No task result {result_id!r}")
    return job


def result_of(job: Job, record: StageRecord | None = None, *, read_record: bool = True):
    """The TaskResult of a task's job (`record`: its run stage's, read here unless given or
    `read_record` is false: a job just accepted has none)."""
    if record is None and read_record and job.state != Job.State.PENDING:
        record = StageRecord.objects.filter(job=job, stage=RUN_STAGE).first()
    payload = job.payload
    task = load_task(payload["task"], payload)
    task = (
        task.using(priority=job.priority, run_after=job.run_after)
        if job.run_after
        else task.using(priority=job.priority)
    )
    status = STATUS[job.state]
    if status == Status.RUNNING and record is not None and record.next_attempt_at is not None:
        status = Status.READY  # its next attempt waits
    result: Any = compat.TaskResult(
        task=task,
        id=str(job.id),
        status=status,
        enqueued_at=job.accepted_at,
        started_at=job.started_at,
        finished_at=job.completed_at if job.ended else None,
        last_attempted_at=record.started_at if record is not None and record.attempts else None,
        args=payload["args"],
        kwargs=payload["kwargs"],
        backend=payload["backend"],
        errors=_errors(job, record) if status == Status.FAILED else [],
        worker_ids=list(record.workers) if record is not None else [],
    )
    if status == Status.SUCCESSFUL and record is not None:
        object.__setattr__(result, "_return_value", record.result)
    return result


def _errors(job: Job, record: StageRecord | None) -> list:
    if record is not None and record.error_type:
        return [
            compat.TaskError(
                exception_class_path=record.error_class or "builtins.Exception",
                traceback=record.error_traceback or "",
            )
        ]
    return [compat.TaskError(exception_class_path=ENDED_WITHOUT_ERROR[job.state], traceback="")]


def running(ctx, task):
    """The TaskResult of the attempt the worker starts now (task_started, the TaskContext)."""
    job = Job.objects.get(pk=ctx.job_id)
    record = StageRecord.objects.filter(job=job, stage=RUN_STAGE).first()
    result = result_of(job, record)
    now = timezone.now()
    object.__setattr__(result, "status", Status.RUNNING)
    object.__setattr__(result, "started_at", result.started_at or now)
    object.__setattr__(result, "last_attempted_at", record.started_at if record is not None else now)
    return result


def succeeded(result, value: Any):
    done = replace(result, status=Status.SUCCESSFUL, finished_at=timezone.now())
    object.__setattr__(done, "_return_value", value)
    return done


def failed(result, exc: BaseException):
    from eventbus.job.stages import class_path

    error = compat.TaskError(
        exception_class_path=class_path(type(exc)), traceback="".join(traceback.format_exception(exc))
    )
    return replace(result, status=Status.FAILED, finished_at=timezone.now(), errors=[*result.errors, error])
