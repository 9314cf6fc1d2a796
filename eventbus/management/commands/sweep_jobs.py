"""sweep_jobs: no accepted job stays stranded (eventbus.job.sweep's Sweeper, every --interval seconds)."""

from django.core.management.base import BaseCommand

from eventbus.bus.consolelog import ensure_console
from eventbus.job.sweep import Sweeper
from eventbus.management.commands._options import add_loop_options


class Command(BaseCommand):
    help = (
        "Enqueue the jobs accepted while the broker was unreachable (PENDING, never "
        "enqueued), and again those whose run was lost (EVENTBUS['RECOVER_AFTER']); time out those "
        "past their deadline. Runs every --interval seconds until SIGTERM/SIGINT."
    )

    def add_arguments(self, parser):
        add_loop_options(parser, burst_help="One pass, then exit.")
        parser.add_argument("--interval", type=float, default=30, help="Seconds between passes (default 30).")
        parser.add_argument(
            "--older-than",
            type=float,
            default=30,
            dest="older_than",
            help="Only jobs accepted at least this many seconds ago (default 30).",
        )

    def handle(self, *args, burst, interval, older_than, metrics_port, metrics_addr, **options):
        from eventbus import metrics

        ensure_console()
        metrics.serve(metrics_port, metrics_addr)
        enqueued = Sweeper(interval=interval, older_than_seconds=older_than, burst=burst).run()
        self.stdout.write(f"Enqueued {enqueued} job(s).")
