"""run_scheduler: enqueue each periodic schedule's ticks, each once (eventbus.djangotasks.schedules's Scheduler)."""

from django.core.management.base import BaseCommand

from eventbus.bus.consolelog import ensure_console
from eventbus.djangotasks.schedules import Scheduler
from eventbus.management.commands._options import add_loop_options


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
        enqueued = Scheduler(burst=burst).run()
        self.stdout.write(f"Enqueued {enqueued} tick(s).")
