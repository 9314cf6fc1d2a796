"""django.tasks tasks the backend's tests enqueue (module level, as Django requires)."""

from __future__ import annotations

from pathlib import Path

from eventbus.djangotasks.compat import task  # django.tasks' on Django 6, the backport's on 5.2


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
