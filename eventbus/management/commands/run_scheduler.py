"""run_scheduler: enqueue each periodic schedule's ticks, each once (eventbus.djangotasks.schedules's Scheduler)."""

import logging
from importlib.util import find_spec

import django
from django.core.management.base import BaseCommand

from eventbus.bus.consolelog import ensure_console
from eventbus.bus.loop import LoopWorker
from eventbus.management.commands._options import add_loop_options

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = (
        "Enqueue the django.tasks tasks of the periodic schedules (an ExactlyOnceBackend's "
        "OPTIONS['SCHEDULES'], and eventbus.schedule() in the installed apps' tasks modules) at "
        "each tick, each tick once however many schedulers run. Looks every second until SIGTERM/SIGINT."
    )

    def add_arguments(self, parser):
        add_loop_options(parser, burst_help="One pass, then exit.")

    def handle(self, *args, burst, metrics_port, metrics_addr, **options):
        from eventbus import metrics

        ensure_console()
        metrics.serve(metrics_port, metrics_addr)
        if task_api_missing():
            enqueued = NoTaskAPI(burst=burst).run()
        else:
            from eventbus.djangotasks.schedules import Scheduler

            enqueued = Scheduler(burst=burst).run()
        self.stdout.write(f"Enqueued {enqueued} tick(s).")


def task_api_missing() -> bool:
    """Django 5.2 without the django-tasks backport has no task API, hence no schedule."""
    return django.VERSION < (6, 0) and find_spec("django_tasks") is None


class NoTaskAPI(LoopWorker):
    """The scheduler of a project with no task API: it has nothing to enqueue, and waits to be
    stopped as the scheduler does, so that run_jobs (which starts it) need not start it again
    and again."""

    name = "run_scheduler"
    one_pass_burst = True
    pause = 1.0

    def setup(self) -> None:
        if not self.burst:
            logger.info(
                "Scheduling 0 schedule(s) (none: Django %s has no django.tasks; "
                'pip install "django-exactly-once[tasks]" for the backport)',
                django.get_version(),
            )

    def work_once(self) -> int:
        return 0
