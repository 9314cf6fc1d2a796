"""django.tasks tasks the backend's tests enqueue (module level, as Django requires)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

# django.tasks' on Django 6, the backport's on 5.2
from eventbus.djangotasks.compat import TaskResultStatus, task, task_finished, task_started


@task
def add(a, b):
    return a + b


@task
def fail(message="boom"):
    raise ValueError(message)


@task(queue_name="reports")
def report(name):
    return {"report": name}


@task(takes_context=True)
def count_to(context, n):
    for i in range(1, n + 1):
        context.report(done=i, of=n, at=i)
    return {"attempt": context.attempt, "counted": n}


@task
async def async_add(a, b):
    return a + b


@task
def append_line(path, line):
    """Appends a line to a file: how many times a task ran, told by its lines."""
    with Path(path).open("a") as f:
        f.write(line + "\n")
    return line


# A task to kill, cancel or read mid-run: it waits for a file (the test's go-ahead), looking at
# its cancel between short sleeps.
HOLD_STEP = 0.05


@task(takes_context=True)
def hold(context, path, gate):
    """Appends "start", waits until the file `gate` exists, then appends "done" and returns
    "done". Cancelled meanwhile, it stops waiting, and its report raises JobCancelled: no "done"."""
    append_line.call(path, "start")
    context.report(done=0, of=1)
    waited = 0
    while not Path(gate).exists() and not context.cancelled:
        time.sleep(HOLD_STEP)
        waited += 1
    context.report(done=1, of=1, waited=waited)
    append_line.call(path, "done")
    return "done"


# Django's task signals as a worker sends them, one line each in the file TEST_TASK_SIGNALS
# names (when set): "<signal> <task id> <status> [<return value> | <error's class>]".
SIGNALS_FILE_ENV = "TEST_TASK_SIGNALS"


def _record_signal(name):
    def receiver(sender, task_result, **kwargs):
        path = os.environ.get(SIGNALS_FILE_ENV)
        if not path:
            return
        words = [name, str(task_result.id), str(task_result.status), sender.__name__]
        if task_result.status == TaskResultStatus.SUCCESSFUL:
            words.append(json.dumps(task_result.return_value))
        elif task_result.status == TaskResultStatus.FAILED:
            words.append(task_result.errors[-1].exception_class_path)
        append_line.call(path, " ".join(words))

    return receiver


task_started.connect(_record_signal("task_started"), weak=False, dispatch_uid="tests.tasks.started")
task_finished.connect(_record_signal("task_finished"), weak=False, dispatch_uid="tests.tasks.finished")
