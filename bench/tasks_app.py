"""The tasks benchmark's Django side (bench/tasks.py; ROOT_URLCONF of bench/tasks_settings.py):
the no-op task, the view that enqueues it and the view a client polls for its result, the same
two URLs in the three systems:

    POST /bench/tasks/enqueue/<kind>/<key>/  enqueue the no-op with the key as its argument and
                                             answer {"id"}: `plain`, `after` (run_after set) or
                                             `prio` (a priority taken from the key's number)
    GET  /bench/tasks/result/<id>/           {"status", "done"}: done once the task's result is
                                             a success, as its backend reports it to any process

- `ours` and `dbtasks`: Django's task API (`noop.enqueue()`, `noop.get_result(id)`), its
  backend the TASKS entry of the system: eventbus.backends.ExactlyOnceBackend or
  django-tasks-db's DatabaseBackend. Done: status SUCCESSFUL.
- `celery`: `noop_celery.delay()` and `AsyncResult(id).state`, read from Celery's Redis result
  backend. Done: state SUCCESS.

Each run of the no-op appends its key to the system's execution log (bench/jobs_stages.py's
O_APPEND log, BENCH_JOBS_EXEC_LOG): a task run twice has its key twice, whatever the system did.
"""

from __future__ import annotations

import datetime
import os

from celery import shared_task
from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from bench.jobs_stages import work
from eventbus.djangotasks import compat

SYSTEM = os.environ.get("BENCH_TASKS_SYSTEM", "ours")
# `prio`: the priorities the enqueues cycle through (Django's -100..100, 0 the default), one of
# each of the broker's four default bands for ours (eventbus.tasks.broker_priority).
PRIORITIES = (100, 0, -50, -100)


def _run(key: str) -> None:
    work(key, "run")


@compat.task
def noop(key: str) -> None:
    """The task: no work but its line in the execution log."""
    _run(key)


@shared_task(name="bench.tasks_noop")
def noop_celery(key: str) -> None:
    """Plain Celery's no-op, the same body."""
    _run(key)


def _after_delay() -> datetime.timedelta:
    return datetime.timedelta(milliseconds=float(os.environ.get("BENCH_TASKS_AFTER_MS") or 0))


@csrf_exempt
@require_POST
def enqueue(request, kind: str, key: str):
    if SYSTEM == "celery":
        return JsonResponse({"id": noop_celery.delay(key).id}, status=201)
    task = noop
    if kind == "after":
        # run_after: now plus BENCH_TASKS_AFTER_MS (0: due at once, already past at the commit).
        task = task.using(run_after=timezone.now() + _after_delay())
    elif kind == "prio":
        task = task.using(priority=PRIORITIES[int(key.rsplit("-", 1)[-1]) % len(PRIORITIES)])
    return JsonResponse({"id": str(task.enqueue(key).id)}, status=201)


@require_GET
def result(request, result_id: str):
    if SYSTEM == "celery":
        state = noop_celery.AsyncResult(result_id).state
        return JsonResponse({"status": state, "done": state == "SUCCESS"})
    try:
        status = noop.get_result(result_id).status
    except compat.TaskResultDoesNotExist:
        return HttpResponse(status=404)
    name = str(getattr(status, "value", status))
    return JsonResponse({"status": name, "done": name == "SUCCESSFUL"})


urlpatterns = [
    path("bench/tasks/enqueue/<str:kind>/<str:key>/", enqueue),
    path("bench/tasks/result/<str:result_id>/", result),
]
