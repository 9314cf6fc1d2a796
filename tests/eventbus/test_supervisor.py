"""run_jobs's supervisor (eventbus.job.supervisor) and the bus commands' console logging
(eventbus.bus.consolelog): a killed process is started again while the others go on, every line is
prefixed with its process's name, and a project without LOGGING still sees the commands run."""

from __future__ import annotations

import io
import logging
import os
import signal
import sys
import threading

import pytest

from eventbus.bus.consolelog import ensure_console
from eventbus.job.supervisor import Supervisor
from tests.processes import wait_for

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"]


@pytest.mark.processes
def test_a_killed_process_is_started_again_and_the_others_go_on():
    out = io.StringIO()
    supervisor = Supervisor({"worker": SLEEPER, "router": SLEEPER}, out=out)
    runner = threading.Thread(target=supervisor.run)
    runner.start()
    try:
        worker, router = supervisor.children
        wait_for(lambda: out.getvalue().count(" | up") == 2, message="both processes up")
        first_worker, first_router = worker.process.pid, router.process.pid
        os.kill(first_worker, signal.SIGKILL)
        wait_for(lambda: "worker | exited (killed by SIGKILL); starting it again in 1 s" in out.getvalue())
        wait_for(lambda: out.getvalue().count("worker | up") == 2, message="the worker up again")
        assert worker.process.pid != first_worker
        assert router.process.pid == first_router and router.process.poll() is None
    finally:
        supervisor.stop()
        runner.join(30)
    assert not runner.is_alive()
    assert worker.process.poll() is not None and router.process.poll() is not None
    assert "router | stopping (SIGTERM)" in out.getvalue()


def test_the_commands_log_to_stderr_without_the_projects_logging():
    logger = logging.getLogger("consolelog-test")
    logger.propagate = False  # as in a project whose LOGGING configures no handler that gets it
    try:
        assert ensure_console("consolelog-test") is True
        assert logger.level == logging.INFO and len(logger.handlers) == 1
        assert ensure_console("consolelog-test") is False  # once
    finally:
        logger.handlers.clear()
        logger.setLevel(logging.NOTSET)
        logger.propagate = True


def test_a_project_with_its_own_logging_keeps_it():
    logger = logging.getLogger("consolelog-test-own")
    own = logging.NullHandler()
    logger.addHandler(own)
    try:
        assert ensure_console("consolelog-test-own") is False
        assert logger.handlers == [own]
    finally:
        logger.removeHandler(own)


def test_run_reclaimer_says_it_runs_in_a_project_without_logging(redis_client, capsys):
    """Django's default logging gives the "eventbus" loggers no handler: before, run_reclaimer ran
    and printed nothing at all; now it says it runs, on stderr."""
    from django.core.management import call_command

    logger = logging.getLogger("eventbus")
    logger.propagate = False  # nothing above it receives its records, as with Django's default
    try:
        call_command("run_reclaimer", burst=True)
        err = capsys.readouterr().err
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
    assert "INFO eventbus: run_reclaimer: running (pid " in err, err
