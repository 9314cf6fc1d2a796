"""The demo's django.tasks task, run by the TASKS backend of config.settings.base
(eventbus.backends.ExactlyOnceBackend) and enqueued by POST /demo/tasks/ (config.views).

    record_visit.enqueue(3)                                  # 3 progress events, then done
    record_visit.using(run_after=later).enqueue(3)           # not started before `later`

Django's task API is `django.tasks` from Django 6.0, the `django-tasks` backport's
`django_tasks` on Django 5.2: the one import below takes whichever this Django has.
"""

from __future__ import annotations

from eventbus.conf import eventbus_settings

from .jobs import simulated_work

try:  # Django 6.0 and later
    from django.tasks import task
except ImportError:  # Django 5.2, with the backport (the toolkit's `tasks` extra)
    from django_tasks import task  # type: ignore[no-redef]


@task(takes_context=True)
def record_visit(context, n: int) -> dict:
    """Record `n` visits, each some simulated work (EVENTBUS["STAGE_SECONDS"]) and a progress
    event on the task's WebSocket; a run resumed after its worker died starts again from the
    first visit, and what it publishes again is dropped as a duplicate.

    Parameters
    ----------
    context : TaskProgress
        The task's context (its `report` publishes a progress event).
    n : int
        How many visits (at most 1000: one progress event each, eventbus.djangotasks.taskjob).

    Returns
    -------
    dict
        `visits`: n; `attempt`: the context's attempt number (django.tasks' TaskContext.attempt).
    """
    for visit in range(1, n + 1):
        simulated_work(eventbus_settings.STAGE_SECONDS)
        context.report(done=visit, of=n, visit=visit)
    return {"visits": n, "attempt": context.attempt}
