"""Django's task API where this Django has it: `django.tasks` (Django 6.0 and later), else the
`django-tasks` backport (`django_tasks`, which Django 5.2 needs: `pip install
"django-exactly-once[tasks]"`). The rest of the package imports these names from here only."""

from __future__ import annotations

try:
    from django.tasks import DEFAULT_TASK_QUEUE_NAME, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    API = "django.tasks"
except ImportError:  # Django 5.2: the backport, when installed
    from django_tasks import DEFAULT_TASK_QUEUE_NAME, task_backends  # type: ignore[no-redef]
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django_tasks.base import (  # type: ignore[no-redef]
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[no-redef]
    from django_tasks.exceptions import (  # type: ignore[no-redef]
        TaskResultDoesNotExist,
    )
    from django_tasks.signals import task_enqueued, task_finished, task_started  # type: ignore[no-redef]
    from django_tasks.utils import normalize_json  # type: ignore[no-redef]

    API = "django_tasks"

__all__ = [
    "API",
    "DEFAULT_TASK_QUEUE_NAME",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
