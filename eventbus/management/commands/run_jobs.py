"""run_jobs: the processes that run, deliver and schedule jobs, in one terminal (eventbus.job.supervisor)."""

import os
import signal
import sys

from django.core.management.base import BaseCommand, CommandError

from eventbus.conf import eventbus_settings
from eventbus.job.supervisor import Supervisor


def sweep_interval() -> float:
    """Often enough that a lost run is found soon after RECOVER_AFTER: a third of it, 1 to 30 s."""
    return round(max(1.0, min(30.0, eventbus_settings.RECOVER_AFTER / 3)), 1)


class Command(BaseCommand):
    help = (
        "Start the Celery worker, run_router, run_reclaimer, sweep_jobs and run_scheduler, print their "
        "output (each line prefixed with its process's name), and start again any that dies. "
        "SIGTERM/SIGINT: stop them all cleanly (again to kill them)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--app",
            help="The Celery app, as `celery -A` takes it (default: the settings module's package).",
        )
        parser.add_argument(
            "--concurrency", type=int, default=4, help="Jobs the worker runs at once (default 4)."
        )

    def handle(self, *args, app, concurrency, **options):
        settings_module = os.environ.get("DJANGO_SETTINGS_MODULE", "")
        app = app or settings_module.split(".")[0]
        if not app:
            raise CommandError("No Celery app: pass --app (as `celery -A` takes it).")
        python = sys.executable
        # The worker's jobs run in threads of one process: killed, it takes every job it ran with
        # it, as a crashed machine would, and leaves no pool process running one behind.
        worker = ["-m", "celery", "-A", app, "worker", "-l", "INFO", "-P", "threads", "-c", str(concurrency)]
        commands = {
            "worker": [python, *worker],
            "router": [python, "-m", "django", "run_router"],
            "reclaimer": [python, "-m", "django", "run_reclaimer"],
            "sweeper": [python, "-m", "django", "sweep_jobs", "--interval", f"{sweep_interval():g}"],
            "scheduler": [python, "-m", "django", "run_scheduler"],
        }
        # The children import the project as this process does: from its folder (manage.py's).
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (sys.path[0] or os.getcwd(), env.get("PYTHONPATH")) if p
        )
        supervisor = Supervisor(commands, out=self.stdout, env=env)

        def on_signal(signum, frame):
            supervisor.stop(force=supervisor.stopping)  # a second signal kills

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, on_signal)
        supervisor.run()
