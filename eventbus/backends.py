"""A backend of Django's task API (`django.tasks`) that runs each task exactly once to
completion, as a job of this toolkit:

    TASKS = {"default": {"BACKEND": "eventbus.backends.ExactlyOnceBackend"}}

- An enqueue is transactional: inside `transaction.atomic()` the task exists only if the
  transaction commits (its job's row is written in it, its run is sent on commit).
- An enqueue can be keyed (eventbus.enqueue_key; a request under an Idempotency-Key keys its
  enqueues itself): enqueued again, it gives the same TaskResult and the task runs once.
- `run_after` is a delayed start kept with the job, never a broker ETA: it survives restarts of
  every process and of Redis (the sweeper, `sweep_jobs`, sends the run once due).
- `priority` (-100..100, higher first) orders the ready runs of a queue on the broker; each of
  QUEUES is the Celery queue of that name, but `default`, which is the Celery app's default queue
  (a worker started with no -Q serves it).
- The run is a job's: recorded, resumed after a worker dies (attempts counted), cancellable and
  retryable (cancel_job, retry_job, the jobs API, the admin), streamed on the job's WebSocket.
- `TaskResult.id` is the job's id; get_result() reads it from the database, from any process.

On Django 5.2, Django's task API comes from the `django-tasks` backport (eventbus.djangotasks.compat).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.checks import Error
from django.db import transaction

from eventbus.djangotasks import compat, keys, results
from eventbus.djangotasks.taskjob import TaskJob

__all__ = ["ExactlyOnceBackend"]


class ExactlyOnceBackend(compat.BaseTaskBackend):
    """Runs django.tasks tasks exactly once to completion, as jobs (see the module doc).

    Parameters
    ----------
    alias : str
        The backend's name in TASKS.
    params : dict
        Its TASKS entry: QUEUES (the queue names tasks may use; default `["default"]`) and
        OPTIONS (none are read yet: an unknown one is refused by its check).
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def enqueue(self, task, args, kwargs):
        """Accept the task as a job (keyed, see eventbus.djangotasks.keys) and send its run once
        the transaction commits, or once its run_after is due.

        Parameters
        ----------
        task : Task
            The task, with its priority, queue and run_after.
        args, kwargs
            Its arguments: JSON (as django.tasks asks), at most EVENTBUS["MAX_PAYLOAD_BYTES"].

        Returns
        -------
        TaskResult
            READY for a new task; for a keyed enqueue made before, the task's result as it
            stands (the same id).

        Raises
        ------
        InvalidTask
            For a task this backend refuses (Django's validation).
        TypeError
            For arguments that are not JSON.
        IdempotencyKeyMismatch
            For a keyed enqueue whose key was used with another task or other arguments.
        """
        from eventbus.services import start_job

        self.validate_task(task)
        args, kwargs = _json_arguments(list(args), dict(kwargs))
        scope, key, owner = keys.next_key()
        payload = {
            "task": task.module_path,
            "args": args,
            "kwargs": kwargs,
            "queue_name": task.queue_name,
            "backend": self.alias,
            "takes_context": task.takes_context,
        }
        job, created = start_job(
            TaskJob,
            payload,
            key=key,
            owner=owner,
            scope=scope,
            run_after=task.run_after,
            queue=celery_queue(task.queue_name),
            priority=task.priority,
        )
        result = results.result_of(job, read_record=not created)
        if created:
            sender = type(self)
            transaction.on_commit(lambda: compat.task_enqueued.send(sender, task_result=result))
        return result

    def get_result(self, result_id):
        """The task's result as it stands, read from its job (any process).

        Parameters
        ----------
        result_id : str
            A TaskResult's id (its job's).

        Returns
        -------
        TaskResult

        Raises
        ------
        TaskResultDoesNotExist
            For an id that is no task's.
        """
        return results.result_of(results.task_job(result_id))

    def check(self, **kwargs):
        errors = [*super().check(**kwargs)]
        unknown = sorted(set(self.options) - KNOWN_OPTIONS)
        if unknown:
            errors.append(
                Error(
                    f"TASKS[{self.alias!r}]['OPTIONS'] has options ExactlyOnceBackend does not know: {unknown}.",
                    hint=f"It reads {sorted(KNOWN_OPTIONS) or 'none'}.",
                    id="eventbus.E020",
                )
            )
        bad = sorted(name for name in self.queues if not _queue_name_ok(name))
        if bad:
            errors.append(
                Error(
                    f"TASKS[{self.alias!r}]['QUEUES'] has names that are no Celery queue name: {bad}.",
                    hint="A queue name is 1 to 64 letters, digits, '.', '_' or '-'.",
                    id="eventbus.E021",
                )
            )
        return errors


KNOWN_OPTIONS: set[str] = set()


def celery_queue(queue_name: str) -> str:
    """The Celery queue of a django.tasks queue: the same name, but `default`, which is the
    Celery app's default queue ("" on the job: no queue named)."""
    return "" if queue_name == compat.DEFAULT_TASK_QUEUE_NAME else queue_name


def _queue_name_ok(name) -> bool:
    return isinstance(name, str) and 0 < len(name) <= 64 and all(c.isalnum() or c in "._-" for c in name)


def _json_arguments(args: list, kwargs: dict) -> tuple[list, dict]:
    """The arguments as they are stored and given to the task: JSON, as django.tasks asks
    (tuples become lists); TypeError for anything else (a model instance: pass its pk)."""
    try:
        normal: Any = compat.normalize_json({"args": args, "kwargs": kwargs})
        json.dumps(normal, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"A task's arguments must be JSON (pass a model's pk, not the model): {exc}") from exc
    return normal["args"], normal["kwargs"]
