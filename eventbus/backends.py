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
- OPTIONS["SCHEDULES"] enqueues tasks periodically, each tick once (`manage.py run_scheduler`,
  eventbus.djangotasks.schedules; `eventbus.schedule()` declares one in code).

On Django 5.2, Django's task API comes from the `django-tasks` backport (eventbus.djangotasks.compat).
"""

from __future__ import annotations

from django.core.checks import Error

from eventbus.djangotasks import compat, keys, results, schedules
from eventbus.djangotasks.enqueue import enqueue_as

__all__ = ["ExactlyOnceBackend"]


class ExactlyOnceBackend(compat.BaseTaskBackend):
    """Runs django.tasks tasks exactly once to completion, as jobs (see the module doc).

    Parameters
    ----------
    alias : str
        The backend's name in TASKS.
    params : dict
        Its TASKS entry: QUEUES (the queue names tasks may use; default `["default"]`) and
        OPTIONS: SCHEDULES, the periodic schedules of its tasks (eventbus.djangotasks.schedules);
        an unknown option is refused by its check.
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
        scope, key, owner = keys.next_key()
        return enqueue_as(self, task, args, kwargs, scope=scope, key=key, owner=owner)[0]

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
        errors.extend(schedules.check_backend(self))
        return errors


KNOWN_OPTIONS = {"SCHEDULES"}


def _queue_name_ok(name) -> bool:
    return isinstance(name, str) and 0 < len(name) <= 64 and all(c.isalnum() or c in "._-" for c in name)
