from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from eventbus.conf import eventbus_settings
from eventbus.job.retention import delete_ended_jobs
from idempotency.conf import idempotency_settings


class Command(BaseCommand):
    help = (
        "Delete the jobs that ended (COMPLETED, FAILED, TIMED_OUT...) longer than "
        "EVENTBUS['KEEP_ENDED_JOBS'] seconds ago, with their stage records, and print how many. "
        "Never a PENDING or RUNNING one."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )

    def handle(self, *args, dry_run, **options):
        keep = eventbus_settings.KEEP_ENDED_JOBS
        if keep is None:
            self.stdout.write("EVENTBUS['KEEP_ENDED_JOBS'] is None: ended jobs are kept for ever.")
            return
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or keep < 0:
            raise CommandError(
                f"EVENTBUS['KEEP_ENDED_JOBS'] is a number of seconds >= 0 or None, not {keep!r}."
            )
        if keep < idempotency_settings.TTL:
            # A replay of the request that started a deleted job would name a job that is gone.
            self.stderr.write(
                f"Warning: EVENTBUS['KEEP_ENDED_JOBS'] ({keep:g} s) is shorter than IDEMPOTENCY['TTL'] "
                f"({idempotency_settings.TTL} s): replayed answers may name deleted jobs."
            )
        deleted = delete_ended_jobs(older_than=timedelta(seconds=keep), dry_run=dry_run)
        if options["verbosity"] > 0:
            verb = "Would delete" if dry_run else "Deleted"
            self.stdout.write(
                f"{verb} {deleted.jobs} ended job(s) and {deleted.stage_records} stage record(s) "
                f"older than {keep:g} s."
            )
