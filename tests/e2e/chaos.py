"""The long chaos run outside pytest (`make chaos`): the whole stack as real processes against a
private database and private Redis, faults at random, then the checker's report.

    python -m tests.e2e.chaos [--jobs 200] [--clients 20] [--duration 300] [--seed N]
                              [--cluster | --sentinel] [--stage-seconds 0.4] [--settle-timeout 180]
                              [--task-share 0.25] [--durable-share 0.2] [--short] [--<fault>s N ...]

The database: a SQLite file in a temporary folder, or, when DATABASE_URL names a PostgreSQL
server, a database `chaos_<pid>` created there (dropped at the end). Exit status 0 when every
guarantee held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def private_database(folder: Path) -> tuple[str, Callable[[], None]]:
    """Point the test settings at a database of our own; returns its name and how to drop it."""
    import dj_database_url

    config = dj_database_url.config(default="sqlite:///unused.sqlite3")
    if config["ENGINE"] == "django.db.backends.sqlite3":
        name = str(folder / "chaos.sqlite3")
        return name, lambda: None
    import psycopg

    name = f"chaos_{os.getpid()}"
    admin: dict[str, Any] = dict(
        host=config["HOST"] or "127.0.0.1",
        port=config["PORT"] or 5432,
        user=config["USER"],
        password=config["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    )
    with psycopg.connect(**admin) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')

    def drop():
        from django.db import connections

        connections.close_all()
        with psycopg.connect(**admin) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return name, drop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument(
        "--duration",
        type=float,
        default=300.0,
        help="Seconds over which the jobs are posted; the faults run as long (default 300).",
    )
    parser.add_argument("--seed", type=int)
    parser.add_argument("--cluster", action="store_true", help="The event bus on a 3-master Redis Cluster.")
    parser.add_argument(
        "--sentinel",
        action="store_true",
        help="Redis as a Sentinel-managed master and replica (3 sentinels), failed over under load.",
    )
    parser.add_argument("--stage-seconds", type=float, default=0.4)
    parser.add_argument(
        "--task-share",
        type=float,
        default=None,
        help="Of the --jobs keys, the share that are django.tasks tasks (POST /demo/tasks/, half of "
        "them delayed 1-5 s) in place of jobs (default 0.25).",
    )
    parser.add_argument(
        "--durable-share",
        type=float,
        default=None,
        help="Of the --jobs keys, the share that are durable_chaos jobs (an atomic ledger stage, a "
        "sleep, a signal sent through the jobs API, 2 children; tests/e2e/durable.py) in place of "
        "scan and chat jobs (default 0.2).",
    )
    parser.add_argument("--settle-timeout", type=float, default=180.0)
    parser.add_argument("--worker-kills", type=int, default=None)
    parser.add_argument("--pool-kills", type=int, default=None)
    parser.add_argument("--daphne-kills", type=int, default=None)
    parser.add_argument(
        "--redis-restarts",
        type=int,
        default=None,
        help="Plain Redis SIGKILLed and restarted (not --cluster).",
    )
    parser.add_argument(
        "--network-stalls", type=int, default=None, help="The workers' link to Redis stalled (not --cluster)."
    )
    parser.add_argument(
        "--failovers",
        type=int,
        default=None,
        help="Failovers: SENTINEL FAILOVER (--sentinel) or CLUSTER FAILOVER of a master (--cluster).",
    )
    parser.add_argument(
        "--backend-kills",
        type=int,
        default=None,
        help="PostgreSQL sessions killed mid-request (DATABASE_URL on PostgreSQL).",
    )
    parser.add_argument("--short", action="store_true", help="The short run of the test suite.")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.test"
    folder = Path(tempfile.mkdtemp(prefix="chaos-"))
    name, drop = private_database(folder)
    os.environ["TEST_DATABASE_NAME"] = name
    import django

    django.setup()
    from django.core.management import call_command

    from .harness import ChaosConfig, run_chaos

    started = time.monotonic()
    try:
        call_command("migrate", verbosity=0)
        print(f"database {name} migrated in {time.monotonic() - started:.1f}s", flush=True)
        values = dict(
            seed=args.seed, cluster=args.cluster, sentinel=args.sentinel, stage_seconds=args.stage_seconds
        )
        if args.short:
            config = ChaosConfig.short(**values)
        else:
            config = ChaosConfig(
                jobs=args.jobs,
                clients=args.clients,
                duration=args.duration,
                settle_timeout=args.settle_timeout,
                **values,
            )
        faults = ("worker_kills", "pool_kills", "daphne_kills", "redis_restarts", "network_stalls")
        for name in (*faults, "failovers", "backend_kills", "task_share", "durable_share"):
            if getattr(args, name) is not None:
                setattr(config, name, getattr(args, name))
        result = run_chaos(config)
        print(result.report, flush=True)
        return 0 if result.ok else 1
    finally:
        drop()


if __name__ == "__main__":
    sys.exit(main())
