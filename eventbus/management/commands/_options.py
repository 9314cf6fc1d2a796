"""Options the bus's long-running commands share, written once."""

import logging
import os

from django.core.management.base import CommandError

from eventbus import metrics
from eventbus.bus.consolelog import ensure_console
from eventbus.jobtypes import UnknownJobType
from eventbus.redis.clients import get_redis
from eventbus.redis.durability import check_durability


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
    """Build the worker (an unknown domain is the command's error), serve metrics, run it; its
    start and progress are logged to stderr even without the project's LOGGING."""
    ensure_console()
    try:
        worker = build()
    except UnknownJobType as exc:
        raise CommandError(str(exc)) from None
    check_durability(get_redis(), process=worker.name)
    metrics.serve(metrics_port, metrics_addr)
    logging.getLogger("eventbus").info("%s: running (pid %d)", worker.name, os.getpid())
    return worker.run()
