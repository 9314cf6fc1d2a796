from django.core.management.base import BaseCommand

from eventbus.bus.reclaimer import Reclaimer, stream_configs
from eventbus.management.commands._options import (
    add_domain_options,
    add_loop_options,
    domain_list,
    run_worker,
)


class Command(BaseCommand):
    help = (
        "Claim entries left pending by routers (XAUTOCLAIM) and settle them; entries past max deliveries "
        "or malformed go to the dead letters. SIGTERM/SIGINT: finish the pass in hand, then exit."
    )

    def add_arguments(self, parser):
        add_loop_options(parser, burst_help="One pass, then exit.")
        add_domain_options(parser)
        parser.add_argument("--interval", type=float, help="Seconds between passes.")
        parser.add_argument("--min-idle-ms", type=int, help="Claim entries idle at least this long.")
        parser.add_argument("--count", type=int, help="Entries per XAUTOCLAIM page.")
        parser.add_argument("--max-deliveries", type=int, help="Dead-letter entries delivered more often.")

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
        metrics_addr,
        **options,
    ):
        run_worker(
            lambda: Reclaimer(
                streams=stream_configs(domain_list(domains)),
                group=group,
                min_idle_ms=min_idle_ms,
                count=count,
                max_deliveries=max_deliveries,
                interval=interval,
                burst=burst,
            ),
            metrics_port=metrics_port,
            metrics_addr=metrics_addr,
        )
