from django.core.management.base import BaseCommand, CommandError

from eventbus import metrics
from eventbus.keys import UnknownDomain
from eventbus.redis import make_redis
from eventbus.router import Router, default_consumer
from eventbus.stopping import GracefulStop


def domain_list(value: str | None) -> list[str] | None:
    return [name.strip() for name in value.split(",") if name.strip()] if value else None


class Command(BaseCommand):
    help = (
        "Route events from the shard streams to state, history and the job channels, in seq order "
        "(one consumer of the group). SIGTERM/SIGINT: finish the batch in hand, then exit."
    )

    def add_arguments(self, parser):
        parser.add_argument("--burst", action="store_true", help="Exit when nothing is left to read.")
        parser.add_argument("--consumer", help="Consumer name in the group (default host-pid).")
        parser.add_argument("--group", help="Consumer group (default EVENTBUS['GROUP']).")
        parser.add_argument("--count", type=int, help="Entries per stream per read.")
        parser.add_argument("--block-ms", type=int, help="How long a read waits for entries.")
        parser.add_argument("--domains", help="Comma-separated domains (default all).")
        parser.add_argument("--metrics-port", type=int, help="Serve Prometheus metrics on this port.")

    def handle(self, *args, burst, consumer, group, count, block_ms, domains, metrics_port, **options):
        consumer = consumer or default_consumer()
        try:
            router = Router(
                domains=domain_list(domains),
                group=group,
                consumer=consumer,
                count=count,
                block_ms=block_ms,
                burst=burst,
                client=make_redis(client_name=f"run_router:{consumer}"),
            )
        except UnknownDomain as exc:
            raise CommandError(str(exc))
        metrics.serve(metrics_port)
        with GracefulStop(router.request_stop, "run_router"):
            router.run()
