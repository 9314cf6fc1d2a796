from django.core.management.base import BaseCommand

from eventbus.bus.router import Router, default_consumer
from eventbus.management.commands._options import (
    add_domain_options,
    add_loop_options,
    domain_list,
    run_worker,
)
from eventbus.redis.clients import make_redis


class Command(BaseCommand):
    help = (
        "Route events from the shard streams to state, history and the job channels, in seq order "
        "(one consumer of the group). SIGTERM/SIGINT: finish the batch in hand, then exit."
    )

    def add_arguments(self, parser):
        add_loop_options(parser, burst_help="Exit when nothing is left to read.")
        add_domain_options(parser)
        parser.add_argument("--consumer", help="Consumer name in the group (default host-pid).")
        parser.add_argument("--count", type=int, help="Entries per stream per read.")
        parser.add_argument("--block-ms", type=int, help="How long a read waits for entries.")

    def handle(
        self, *args, burst, consumer, group, count, block_ms, domains, metrics_port, metrics_addr, **options
    ):
        consumer = consumer or default_consumer()
        run_worker(
            lambda: Router(
                domains=domain_list(domains),
                group=group,
                consumer=consumer,
                count=count,
                block_ms=block_ms,
                burst=burst,
                client=make_redis(client_name=f"run_router:{consumer}"),
            ),
            metrics_port=metrics_port,
            metrics_addr=metrics_addr,
        )
