"""run_scheduler where Django has no task API (Django 5.2 without the django-tasks backport):
run_jobs starts it in every project, so it must wait to be stopped rather than crash and be
started again and again."""

from __future__ import annotations

import logging
import sys
import threading
from io import StringIO

import django
from django.core.management import call_command

from eventbus.management.commands import run_scheduler


def test_the_task_api_is_found_where_this_django_has_one():
    # The suite runs on Django 5.2 with the backport, or on Django 6: a task API either way.
    assert run_scheduler.task_api_missing() is False


def test_on_django_5_2_without_the_backport_the_api_is_missing(monkeypatch):
    monkeypatch.setattr(django, "VERSION", (5, 2, 0, "final", 0))
    monkeypatch.setattr(run_scheduler, "find_spec", lambda name: None)
    assert run_scheduler.task_api_missing() is True
    monkeypatch.setattr(django, "VERSION", (6, 0, 0, "final", 0))
    assert run_scheduler.task_api_missing() is False  # django.tasks is Django's own


def test_without_a_task_api_it_enqueues_nothing_and_never_reads_a_schedule(monkeypatch):
    monkeypatch.setattr(run_scheduler, "task_api_missing", lambda: True)
    monkeypatch.setitem(sys.modules, "eventbus.djangotasks.schedules", None)  # importing it would fail
    out = StringIO()
    call_command("run_scheduler", "--burst", stdout=out)
    assert out.getvalue() == "Enqueued 0 tick(s).\n"


def test_without_a_task_api_it_says_so_and_runs_until_stopped(caplog):
    idle = run_scheduler.NoTaskAPI()
    caplog.set_level(logging.INFO, logger="eventbus")
    runner = threading.Thread(target=idle.run)
    runner.start()
    try:
        runner.join(1.5)
        assert runner.is_alive()  # a process that exits would be started again by run_jobs
    finally:
        idle.request_stop()
        runner.join(5)
    assert not runner.is_alive()
    assert any("Scheduling 0 schedule(s) (none: Django" in r.getMessage() for r in caplog.records)
