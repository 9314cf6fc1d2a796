from django.core.management.base import BaseCommand

from eventbus.sweep import Sweeper


class Command(BaseCommand):
    help = (
        "Enqueue the jobs of operations accepted while the broker was unreachable (PENDING, never "
        "enqueued), and again those whose run was lost (EVENTBUS['RECOVER_AFTER']); time out those "
        "past their deadline. Runs every --interval seconds until SIGTERM/SIGINT."
    )

    def add_arguments(self, parser):
        parser.add_argument("--burst", action="store_true", help="One pass, then exit.")
        parser.add_argument("--interval", type=float, default=30, help="Seconds between passes (default 30).")
        parser.add_argument(
            "--older-than",
            type=float,
            default=30,
            dest="older_than",
            help="Only operations accepted at least this many seconds ago (default 30).",
        )

    def handle(self, *args, burst, interval, older_than, **options):
        sweeper = Sweeper(interval=interval, older_than_seconds=older_than)
        enqueued = sweeper.run(burst=burst)
        self.stdout.write(f"Enqueued {enqueued} operation(s).")
