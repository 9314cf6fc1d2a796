"""A task accepted as its job under a given (scope, key): what every enqueue of
eventbus.backends.ExactlyOnceBackend does, with the key an enqueue takes (eventbus.djangotasks.keys)
or the key of a schedule's tick (eventbus.djangotasks.schedules)."""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction

from . import compat, results
from .taskjob import TaskJob


def enqueue_as(backend, task, args, kwargs, *, scope: str, key: str, owner=None) -> tuple[Any, bool]:
    """Accept the task as the job of (scope, key), once, and send its run once the transaction
    commits (or once its run_after is due).

    Parameters
    ----------
    backend : ExactlyOnceBackend
        The backend enqueueing it (it validates the task; its alias is kept with the job).
    task : Task
        The task, with its priority, queue and run_after.
    args, kwargs
        Its arguments: JSON, at most EVENTBUS["MAX_PAYLOAD_BYTES"].
    scope, key : str
        The job's idempotency scope and key.
    owner : User, optional
        The job's owner; None: nobody.

    Returns
    -------
    tuple of (TaskResult, bool)
        The task's result (READY when new), and whether this call created its job.

    Raises
    ------
    InvalidTask
        For a task the backend refuses.
    TypeError
        For arguments that are not JSON.
    IdempotencyKeyMismatch
        For a key used before with another task or other arguments.
    """
    from eventbus.services import start_job

    backend.validate_task(task)
    args, kwargs = json_arguments(list(args), dict(kwargs))
    payload = {
        "task": task.module_path,
        "args": args,
        "kwargs": kwargs,
        "queue_name": task.queue_name,
        "backend": backend.alias,
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
        sender = type(backend)
        transaction.on_commit(lambda: compat.task_enqueued.send(sender, task_result=result))
    return result, created


def celery_queue(queue_name: str) -> str:
    """The Celery queue of a django.tasks queue: the same name, but `default`, which is the
    Celery app's default queue ("" on the job: no queue named)."""
    return "" if queue_name == compat.DEFAULT_TASK_QUEUE_NAME else queue_name


def json_arguments(args: list, kwargs: dict) -> tuple[list, dict]:
    """The arguments as they are stored and given to the task: JSON, as django.tasks asks
    (tuples become lists); TypeError for anything else (a model instance: pass its pk)."""
    try:
        normal: Any = compat.normalize_json({"args": args, "kwargs": kwargs})
        json.dumps(normal, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"A task's arguments must be JSON (pass a model's pk, not the model): {exc}") from exc
    return normal["args"], normal["kwargs"]
