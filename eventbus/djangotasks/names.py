"""What names a task's job: its type, its one stage, and the Task its payload names."""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from . import compat

TASK_JOB = "task"
RUN_STAGE = "run"


def load_task(path: str, payload: dict[str, Any]):
    """The Task a job's payload names, as it was enqueued (its queue and backend): an import
    of `path` that must give a django.tasks Task, never any other callable."""
    try:
        task = import_string(path)
    except ImportError as exc:
        raise ImportError(f"The task {path!r} cannot be imported: {exc}") from exc
    if not isinstance(task, compat.Task):
        raise TypeError(f"{path!r} is not a django.tasks task (decorate its function with @task)")
    return task.using(queue_name=payload["queue_name"], backend=payload["backend"])
