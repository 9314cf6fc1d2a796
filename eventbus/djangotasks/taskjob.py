"""The job type every django.tasks task runs as: `task`, one stage, `run`, which calls the task's
function with the enqueued arguments. Its payload names the task (its module path) and holds
its arguments, its queue and its backend's alias; its stage's result is the task's return value.

So a task is run, resumed after its worker dies, cancelled and retried as any job is, and shows
wherever jobs do (the jobs API, the page, the admin, its WebSocket). The jobs API cannot start
one (`startable_by_api`): only an enqueue, in code, names the task a job calls. It is
registered when a TASKS backend is ExactlyOnceBackend (eventbus.jobtypes.registry).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eventbus.job.stages import RunStopped, _record_failure, failure_of
from eventbus.jobtypes import InvalidPayload, JobCancelled, JobType, Stage

from . import compat, results
from .names import RUN_STAGE, TASK_JOB, load_task

# Progress events a task may report (TaskContext.report): the width of its stage's seqs.
MAX_TASK_EVENTS = 1000
PAYLOAD_FIELDS = {"task", "args", "kwargs", "queue_name", "backend", "takes_context"}


class TaskJob(JobType):
    """A django.tasks task, enqueued through eventbus.backends.ExactlyOnceBackend."""

    name = TASK_JOB
    stages = (Stage(RUN_STAGE, "Running the task", width=MAX_TASK_EVENTS),)
    final_label = "Task finished"
    description = "A django.tasks task (enqueued in code, never by this API)."
    startable_by_api = False

    def clean_payload(self, payload: dict) -> dict:
        missing = PAYLOAD_FIELDS - set(payload)
        if (
            missing
            or not isinstance(payload.get("args"), list)
            or not isinstance(payload.get("kwargs"), dict)
        ):
            raise InvalidPayload("A task's job is made by a django.tasks enqueue, not by hand.")
        return payload

    def run(self, ctx):
        task = load_task(ctx.payload["task"], ctx.payload)
        task_result = results.running(ctx, task)
        compat.task_started.send(type(task.get_backend()), task_result=task_result)
        args, kwargs = ctx.payload["args"], ctx.payload["kwargs"]
        try:
            if task.takes_context:
                value = task.call(TaskProgress(task_result=task_result, stage=ctx), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
            value = compat.normalize_json(value)
        except Exception as exc:
            from eventbus.job.runs import TRANSIENT_ERRORS

            if not isinstance(exc, TRANSIENT_ERRORS + (JobCancelled,)):  # those run again, or end CANCELLED
                failed = results.failed(task_result, exc)
                compat.task_finished.send(type(task.get_backend()), task_result=failed)
            raise
        except (SystemExit, KeyboardInterrupt) as exc:
            if worker_stopping(exc):
                raise  # the attempt is lost with its process: the task runs again
            failed = results.failed(task_result, exc)
            compat.task_finished.send(type(task.get_backend()), task_result=failed)
            _record_failure(ctx._job, ctx.stage, exc)
            raise TaskExited(ctx.job_id, exc) from exc
        compat.task_finished.send(type(task.get_backend()), task_result=results.succeeded(task_result, value))
        return value


class TaskExited(RunStopped):
    """The task's own SystemExit or KeyboardInterrupt (`sys.exit()` in its body), made its
    failure as Django's backends make it: FAILED, its error that exception. Left as it is, it
    would end the Celery pool process instead (billiard reports it, then exits), the task's job
    RUNNING until its recovery ran it again, to exit again.

    TaskJob.run records the failure, with the exception's own class and traceback; raised as a
    RunStopped, this then ends the job FAILED without the run recording it again."""

    def __init__(self, job_id: str, exc: BaseException):
        super().__init__(f"Job {job_id}: the task raised {type(exc).__name__}")
        self._eventbus_failure = failure_of(exc)  # the final event tells the task's exception


def worker_stopping(exc: BaseException) -> bool:
    """Whether a SystemExit is the worker's shutdown rather than the task's own: Celery's
    WorkerShutdown or WorkerTerminate, or the SystemExit a prefork pool process raises on its
    terminate signal (billiard notes that its handler fired). A KeyboardInterrupt is always the
    task's: a pool process ignores SIGINT."""
    from celery.exceptions import WorkerShutdown, WorkerTerminate

    if isinstance(exc, WorkerShutdown | WorkerTerminate):
        return True
    if not isinstance(exc, SystemExit):
        return False
    try:
        from billiard import common
    except ImportError:  # pragma: no cover  # Celery's own dependency
        return False
    fired = getattr(common, "terminate_handler_fired", None)  # billiard 4.3
    if fired is not None:
        return bool(fired())
    return bool(getattr(common, "_should_have_exited", [False])[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskProgress(compat.TaskContext):  # type: ignore[misc]  # frozen as Django's is
    """The `context` of a task declared with `takes_context=True`: Django's TaskContext
    (`task_result`, `attempt`) with the job's progress and cancel (a stage's ctx).

        @task(takes_context=True)
        def import_rows(context, path):
            for i, row in enumerate(rows, 1):
                context.report(done=i, of=len(rows))   # an event on the job's WebSocket
    """

    stage: Any

    def report(
        self, *, done: float | None = None, of: float | None = None, progress: int | None = None, **data
    ):
        """Publish a progress event now (see StageContext.report); raises JobCancelled once the
        task's job is cancelled."""
        self.stage.report(done=done, of=of, progress=progress, **data)

    @property
    def key(self) -> str:
        """Stable across the task's attempts: an idempotency key for outside APIs."""
        return self.stage.key

    @property
    def cancelled(self) -> bool:
        """True once the task's job is cancelled: stop early."""
        return self.stage.cancelled
