"""Options the bus's long-running commands share, written once."""

from django.core.management.base import CommandError

from eventbus import metrics
from eventbus.durability import check_durability
from eventbus.jobtypes import UnknownDomain
from eventbus.redis import get_redis


def add_loop_options(parser, *, burst_help: str) -> None:
    parser.add_argument("--burst", action="store_true", help=burst_help)
    parser.add_argument(
        "--metrics-port", type=int, help="Serve this process's Prometheus metrics on this port."
    )
    parser.add_argument(
        "--metrics-addr",
        default=metrics.LOOPBACK,
        help="The address --metrics-port listens on (default 127.0.0.1: this machine only; 0.0.0.0: all).",
    )


def add_domain_options(parser) -> None:
    parser.add_argument("--group", help="Consumer group (default EVENTBUS['GROUP']).")
    parser.add_argument(
        "--domains",
        help="Comma-separated domains (default all); domain:shard names one shard stream (run_router).",
    )


def domain_list(value: str | None) -> list[str] | None:
    return [name.strip() for name in value.split(",") if name.strip()] if value else None


def run_worker(build, *, metrics_port: int | None, metrics_addr: str = metrics.LOOPBACK) -> int:
    """Build the worker (an unknown domain is the command's error), serve metrics, run it."""
    try:
        worker = build()
    except UnknownDomain as exc:
        raise CommandError(str(exc)) from None
    check_durability(get_redis(), process=worker.name)
    metrics.serve(metrics_port, metrics_addr)
    return worker.run()
