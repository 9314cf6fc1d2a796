from django.core.management.base import BaseCommand

from idempotency.conf import idempotency_settings


class Command(BaseCommand):
    help = "Delete expired idempotency records and print how many were deleted."

    def handle(self, *args, **options):
        deleted = idempotency_settings.STORE.clear_expired()
        if options["verbosity"] > 0:
            self.stdout.write(f"Deleted {deleted} expired idempotency record(s).")
