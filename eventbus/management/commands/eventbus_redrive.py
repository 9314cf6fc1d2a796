from django.core.management.base import BaseCommand, CommandError

from eventbus.jobtypes import UnknownDomain
from eventbus.redrive import redrive


class Command(BaseCommand):
    help = (
        "Put a domain's dead letters back on their shard streams, in seq order, for the router to apply. "
        "Malformed dead letters stay."
    )

    def add_arguments(self, parser):
        parser.add_argument("--domain", required=True)
        parser.add_argument("--dry-run", action="store_true", help="List what would be re-driven.")

    def handle(self, *args, domain, dry_run, **options):
        try:
            letters = redrive(domain, dry_run=dry_run)
        except UnknownDomain as exc:
            raise CommandError(str(exc)) from None
        done = 0
        for letter in letters:
            where = f"{letter.stream_key} {letter.original_stream_id}"
            if letter.malformed:
                self.stdout.write(f"kept     {where}: malformed ({letter.malformed})")
            elif dry_run:
                self.stdout.write(f"would    {where} job {letter.job_id} seq {letter.seq} ({letter.reason})")
            elif letter.new_id:
                done += 1
                self.stdout.write(f"redriven {where} -> {letter.new_id} job {letter.job_id} seq {letter.seq}")
        verb = "would re-drive" if dry_run else "re-drove"
        count = sum(1 for letter in letters if not letter.malformed) if dry_run else done
        self.stdout.write(f"{domain}: {verb} {count} of {len(letters)} dead letter(s).")
