from django.core.management.base import BaseCommand, CommandError

from eventbus import metrics
from eventbus.keys import UnknownDomain
from eventbus.management.commands.run_router import domain_list
from eventbus.reclaimer import Reclaimer, stream_configs
from eventbus.stopping import GracefulStop


class Command(BaseCommand):
    help = (
        "Claim entries left pending by routers (XAUTOCLAIM) and settle them; entries past max deliveries "
        "or malformed go to the dead letters. SIGTERM/SIGINT: finish the pass in hand, then exit."
    )

    def add_arguments(self, parser):
        parser.add_argument("--burst", action="store_true", help="One pass, then exit.")
        parser.add_argument("--interval", type=float, help="Seconds between passes.")
        parser.add_argument("--min-idle-ms", type=int, help="Claim entries idle at least this long.")
        parser.add_argument("--count", type=int, help="Entries per XAUTOCLAIM page.")
        parser.add_argument("--max-deliveries", type=int, help="Dead-letter entries delivered more often.")
        parser.add_argument("--group", help="Consumer group (default EVENTBUS['GROUP']).")
        parser.add_argument("--domains", help="Comma-separated domains (default all).")
        parser.add_argument("--metrics-port", type=int, help="Serve Prometheus metrics on this port.")

    def handle(
        self,
        *args,
        burst,
        interval,
        min_idle_ms,
        count,
        max_deliveries,
        group,
        domains,
        metrics_port,
        **options,
    ):
        try:
            reclaimer = Reclaimer(
                streams=stream_configs(domain_list(domains)),
                group=group,
                min_idle_ms=min_idle_ms,
                count=count,
                max_deliveries=max_deliveries,
                interval=interval,
                burst=burst,
            )
        except UnknownDomain as exc:
            raise CommandError(str(exc))
        metrics.serve(metrics_port)
        with GracefulStop(reclaimer.request_stop, "run_reclaimer"):
            reclaimer.run()
