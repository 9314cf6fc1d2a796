"""The tasks of django-tasks' own test project (its tests/tasks.py), as tests/tasks/test_ported.py
enqueues them on ExactlyOnceBackend, with a few of this suite's: a task that waits for a file
(to kill or stop its worker mid-task) and tasks whose return values Django normalises.

Portions copyright (c) Jake Howard and individual contributors (django-tasks, BSD-3-Clause:
the notice and its conditions are in tests/tasks/test_ported.py).
"""

from __future__ import annotations

import sys
import time
from decimal import Decimal
from pathlib import Path

# django.tasks' on Django 6, the backport's on 5.2
from eventbus.djangotasks.compat import TaskContext, task


@task()
def noop_task(*args, **kwargs):
    return None


@task
def noop_task_from_bare_decorator(*args, **kwargs):
    return None


@task()
async def noop_task_async(*args, **kwargs):
    return None


@task()
def calculate_meaning_of_life():
    return 42


@task()
def failing_task_value_error():
    raise ValueError("This task failed due to ValueError")


@task()
def failing_task_system_exit():
    raise SystemExit("This task failed due to SystemExit")


@task()
def failing_task_keyboard_interrupt():
    raise KeyboardInterrupt("This task failed due to KeyboardInterrupt")


@task()
def complex_exception():
    raise ValueError(ValueError("This task failed"))


@task()
def complex_return_value():
    # Something that is neither JSON nor picklable
    return lambda: True


@task()
def exit_task():
    sys.exit(1)


@task(takes_context=True)
def get_task_id(context):
    return context.task_result.id


@task(takes_context=True)
def check_context(context, attempt):
    """The original's `test_context` (renamed: pytest would collect it)."""
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt
    assert context.task_result.attempts == attempt
    return {"attempt": context.attempt, "id": context.task_result.id}


# Return values: what Django's normalize_json makes of them, and what it refuses.


@task()
def return_normalisable():
    return {"tuple": (1, 2), "bytes": b"text", "nested": [{"a": (None, True, 1.5)}]}


@task()
def return_decimal():
    return Decimal("12.50")


# This suite's: tasks to hold a worker with, and to count runs by.


@task()
def append_line(path, line):
    """Appends a line to a file: how many times the task ran, told by its lines."""
    with Path(path).open("a") as f:
        f.write(line + "\n")
    return line


GATE_STEP = 0.05


@task(takes_context=True)
def wait_for_gate(context, path, gate):
    """Appends "start <attempt>" to `path`, waits until the file `gate` exists (a test's
    go-ahead), then appends "done" and returns the attempt it finished in."""
    append_line.call(path, f"start {context.attempt}")
    while not Path(gate).exists():
        time.sleep(GATE_STEP)
    append_line.call(path, "done")
    return context.attempt
