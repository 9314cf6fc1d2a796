"""Retry many jobs that did not complete: `retry_jobs --state FAILED --domain payout --since 2h`.

Each job is retried under the key `retry:<its id>` (eventbus.services.retry_key) in the
operators' scope (eventbus.services.retry_as_operator), which no user's request can write; the
new job is its owner's. Running the command twice retries each job once. Jobs retried before (by
any key) are left alone: their retry is the job to retry now (one retried meanwhile is reported
"already retried as <id>").
"""

import re
from datetime import UTC, datetime, timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from eventbus.exceptions import JobAlreadyRetried, JobServiceError
from eventbus.models import Job
from eventbus.selectors import jobs_to_retry
from eventbus.services import retry_as_operator

_AGO = re.compile(r"^(\d+)([mhd])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}


def since_value(text: str) -> datetime:
    """An ISO 8601 date or date-time (UTC unless it says), or an age: 30m, 2h, 3d."""
    ago = _AGO.match(text.strip())
    if ago:
        return timezone.now() - timedelta(**{_UNITS[ago.group(2)]: int(ago.group(1))})
    value = parse_datetime(text.strip()) or parse_datetime(text.strip() + "T00:00:00")
    if value is None:
        raise CommandError(f"--since {text!r}: give an ISO 8601 date or date-time, or an age (30m, 2h, 3d).")
    return value if timezone.is_aware(value) else timezone.make_aware(value, UTC)


class Command(BaseCommand):
    help = (
        "Retry the jobs that ended FAILED (or --state TIMED_OUT, CANCELLED) and have no retry yet: "
        "each a new job reusing its finished stages. Keyed retry:<job id>, so a second run retries none twice."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--state",
            action="append",
            choices=[str(state) for state in Job.RETRYABLE_STATES],
            help="The jobs' state (repeat for several; default FAILED).",
        )
        parser.add_argument("--domain", help="Only jobs of this type.")
        parser.add_argument(
            "--since", type=since_value, help="Only jobs that ended since: ISO date or 30m/2h/3d."
        )
        parser.add_argument("--limit", type=int, default=1000, help="At most this many jobs (default 1000).")
        parser.add_argument("--dry-run", action="store_true", help="List what would be retried.")

    def handle(self, *args, state, domain, since, limit, dry_run, **options):
        jobs = list(jobs_to_retry(states=state or ["FAILED"], domain=domain, since=since)[:limit])
        retried = 0
        for job in jobs:
            what = f"{job.id} ({job.domain}, {job.state}, ended {job.completed_at:%Y-%m-%d %H:%M:%S})"
            if dry_run:
                self.stdout.write(f"would retry {what}")
                continue
            try:
                new, created = retry_as_operator(job)
            except JobAlreadyRetried as exc:  # by its owner, or by another run, since the list was read
                self.stdout.write(f"already retried {what} as {exc.retried_by}")
                continue
            except JobServiceError as exc:  # the owner's caps: the next run retries it
                self.stderr.write(f"not retried {what}: {exc}")
                continue
            retried += created
            self.stdout.write(f"{'retried' if created else 'retried before'} {what} -> {new.id}")
        verb = "would retry" if dry_run else "retried"
        self.stdout.write(f"{verb} {len(jobs) if dry_run else retried} of {len(jobs)} job(s).")
