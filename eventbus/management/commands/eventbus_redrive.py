"""eventbus_redrive: a domain's dead letters back on their shard streams (eventbus.bus.redrive).

A malformed letter stays where it is, named on stderr (its dead-letter id, then why); the
command still exits 0, its last line counting what was re-driven and what was kept. It exits
non-zero only when nothing could be done: an unknown domain, or Redis not answering.
"""

from django.core.management.base import BaseCommand, CommandError
from redis.exceptions import RedisError

from eventbus.bus.redrive import redrive
from eventbus.jobtypes import UnknownJobType


class Command(BaseCommand):
    help = (
        "Put a domain's dead letters back on their shard streams, in seq order, for the router to apply. "
        "Malformed dead letters stay, each named in a warning."
    )

    def add_arguments(self, parser):
        parser.add_argument("--domain", required=True)
        parser.add_argument("--dry-run", action="store_true", help="List what would be re-driven.")

    def handle(self, *args, domain, dry_run, **options):
        try:
            letters = redrive(domain, dry_run=dry_run)
        except UnknownJobType as exc:
            raise CommandError(str(exc)) from None
        except RedisError as exc:
            raise CommandError(f"Redis did not answer: {exc}") from None
        done = kept = 0
        for letter in letters:
            if letter.malformed:
                kept += 1
                self.stderr.write(
                    f"kept     {letter.dead_key} {letter.dead_id}: malformed ({letter.malformed})",
                    self.style.WARNING,
                )
                continue
            where = f"{letter.stream_key} {letter.original_stream_id}"
            if dry_run:
                self.stdout.write(f"would    {where} job {letter.job_id} seq {letter.seq} ({letter.reason})")
            elif letter.new_id:
                done += 1
                self.stdout.write(f"redriven {where} -> {letter.new_id} job {letter.job_id} seq {letter.seq}")
        verb = "would re-drive" if dry_run else "re-drove"
        count = len(letters) - kept if dry_run else done
        self.stdout.write(
            f"{domain}: {verb} {count} of {len(letters)} dead letter(s); {kept} malformed kept."
        )
