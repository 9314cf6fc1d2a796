#!/usr/bin/env python
"""Jobs end to end, the headline benchmark (the README's Measured table): a script, never a test.

    make bench-jobs BENCH_JOBS_ARGS="--jobs 300 --concurrency 16 --rounds 3"
    .venv/bin/python bench/jobs.py [--jobs 300] [--concurrency 16] [--rounds 3] [--workers 2]
        [--warmup 32] [--stage-ms 0] [--db-pool 8] [--dbos-polling 0.1] [--no-pause] [--no-report]
        [--no-profile] [--profile-jobs N] [--profile-rate 200]

Jobs completed per second on this machine, each job a keyed POST (an `Idempotency-Key`), four
stages (bench/jobs_stages.py: each logs its execution and returns a small dict; `--stage-ms`
adds the same sleep to each in all three), their progress carried to a WebSocket that watches the
job, until its final frame; and POST -> first progress frame p50/p99. Three systems side by
side in one run, each with --workers worker processes, on the same PostgreSQL server
(DATABASE_URL if it is PostgreSQL, else postgres://postgres@127.0.0.1:5432, each system its own
databases, created from one migrated template and dropped at the end):

- ours: the project's stack. uvicorn serving config.asgi (as the Procfile runs it), a Celery
  worker (prefork, --workers processes), `manage.py run_router`, a private durable redis-server
  (AOF, as the README requires of the bus's Redis). The job type bench.jobs_stages.BenchJob
  (EVENTBUS["JOB_TYPES"], bench/jobs_settings.py). The client POSTs /api/jobs/ (token auth),
  then opens /ws/jobs/<job_id>/ (session cookie): the gateway backfills, nothing is missed.
- channels, baseline (a) "Celery + Channels": a DRF view enqueues a Celery task that runs the
  stages and sends each frame with `async_to_sync(channel_layer.group_send)` (channels_redis);
  a Channels consumer joins the job's group and forwards (bench/jobs_baselines.py, served by
  uvicorn too). Its own private redis-server (Channels' layer and Celery's broker, the same
  broker setup as ours, not durable: Channels asks for no persistence). The job's id comes from
  the client's key, so the client opens its socket *first*, then POSTs: a fair run loses
  nothing. Its Celery worker has as many processes as ours.
- dbos, baseline (b) DBOS Transact: --workers worker processes (bench/jobs_dbos.py) execute a
  workflow of four steps from a DBOS queue, writing each frame to the workflow's stream; a DRF
  view enqueues it through a DBOSClient with the Idempotency-Key as its workflow id, a Channels
  consumer reads the stream (DBOSClient.read_stream_async) and forwards it (DBOS's "queue worker"
  deployment, its web tier in the same Django project and server as baseline (a)'s). The client
  POSTs, then opens the socket: the stream is read from its start, nothing is missed.

The Django ASGI servers of all three take their database connections from Django's psycopg pool
(--db-pool; Django's advice under ASGI, where each request runs in a thread of its own), the
Celery workers keep persistent ones, DBOS's processes have their own SQLAlchemy pools.

Each system is warmed up, then measured --rounds times, the rounds interleaved in a rotating
order; while one system is measured the others' processes are paused (SIGSTOP; --no-pause keeps
them running). The best round of each system is kept (all are listed); the latency percentiles
pool every measured round. Every frame is checked at the client: duplicates, lost, reordered.

Then the guarantees, per system: `--probe-jobs` jobs whose socket opens only after the POST
answered (ours' and DBOS's order anyway; baseline (a)'s socket then misses what was sent
before it joined), and `--retried` keys POSTed twice, the second right after the first answer:
second executions (from the stages' execution log, whatever the system did), duplicate frames.
Database writes per finished stage (every write statement of the system's processes, logged, and
the rows written, pg_stat_user_tables) are counted too.

Then (--profile, the default) one more round of ours, not counted (py-spy slows it): py-spy on its
web server, its Celery worker (the pool's processes apart from the main one) and its router, CPU ms
per job by function (self and inclusive) and by package (bench/profiling.py).

Results are printed and written to bench/REPORT-jobs.md; raw figures go to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import functools
import gc
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import (
    BIN,
    Context,
    KeepAlive,
    System,
    celery_command,
    only,
    postgres_cpu,
    redis_version,
    running,
    setup,
    start,
    wait_ready,
    write_raw,
)
from bench.jobs_stages import DOMAIN, EXPECTED_SEQS, STAGES
from bench.processes import Process, wait_for
from bench.profiling import Profiler, cpu_profile, cpu_profile_markdown
from bench.report import markdown_table, verdict
from bench.stats import median, percentile, ratio
from config.redis_server import RedisServer, free_port

REPORT = ROOT / "bench" / "REPORT-jobs.md"
RESULTS_DIR = ROOT / "bench" / "results"
SYSTEMS = ("ours", "channels", "dbos")
NAMES = {"ours": "ours", "channels": "Celery + Channels", "dbos": "DBOS Transact"}
# The targets: ours' jobs/s over each baseline's; and ours' POST -> first frame p50 with one
# client no higher than this baseline's.
TARGETS = {"channels": 1.3, "dbos": 1.5}
ALONE_P50_BASELINE = "channels"


# --- the systems ------------------------------------------------------------------------------


@dataclass(kw_only=True)
class JobSystem(System):
    post_path: str
    ws_prefix: str
    socket_first: bool  # the client opens its socket before the POST (it knows the job's id)
    databases: list[str]

    def ws_url(self, job_id: str) -> str:
        return f"ws://127.0.0.1:{self.port}{self.ws_prefix}{job_id}/"


def django_env(system: str, database_url: str, redis_url: str, exec_log: Path, args, **extra: str) -> dict:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="bench.jobs_settings",
        BENCH_JOBS_SYSTEM=system,
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        BENCH_JOBS_EXEC_LOG=str(exec_log),
        BENCH_JOBS_WRITE_LOG=str(exec_log.with_name(f"writes-{system}.log")),
        BENCH_STAGE_MS=str(args.stage_ms),
        LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    env.pop("CELERY_BROKER_URL", None)
    env.pop("CACHE_URL", None)
    env.update(extra)
    return env


def web_settings(env: dict, args) -> dict:
    """An ASGI server's environment: Django's connection pool (--db-pool connections at most), or
    none (CONN_MAX_AGE 0: a connection per request; Django runs each one in a thread of its own, so
    persistent connections would pile up)."""
    web = {**env, "BENCH_CONN_MAX_AGE": "0"}
    if args.db_pool:
        web["BENCH_DB_POOL"] = str(args.db_pool)
    return web


def uvicorn_command(app: str, port: int, *options: str) -> list[str]:
    return [
        str(BIN / "uvicorn"),
        app,
        *("--host", "127.0.0.1", "--port", str(port), "--lifespan", "off"),
        *("--log-level", "warning", "--no-access-log"),
        *options,
    ]


def start_ours(ctx: JobsContext, args) -> JobSystem:
    redis_server = ctx.ours_redis  # started first: this process's Django reads its URL
    assert redis_server is not None
    db = ctx.databases["ours"]
    system = JobSystem(
        "ours",
        free_port(),
        ctx.log_dir / "exec-ours.log",
        redis=redis_server,
        post_path="/api/jobs/",
        ws_prefix="/ws/jobs/",
        socket_first=False,
        databases=[db],
    )
    ctx.started.append(system)
    env = django_env(
        "ours", ctx.db_url(db), redis_server.url, system.exec_log, args, BENCH_CONN_MAX_AGE="300"
    )
    web_env = web_settings(env, args)
    system.children = [
        start(
            "ours-web",
            uvicorn_command(
                "config.asgi:application",
                system.port,
                *("--ws", "gateway.uvicorn:WebSocketProtocol", "--ws-per-message-deflate", "false"),
            ),
            web_env,
            ctx.log_dir,
        ),
        start("ours-worker", celery_command("ours", args.workers), env, ctx.log_dir, " ready."),
        start("ours-router", [sys.executable, "manage.py", "run_router"], env, ctx.log_dir),
    ]
    system.description = (
        f"uvicorn config.asgi (gateway.uvicorn protocol, no deflate), Celery prefork x{args.workers}, "
        f"run_router, redis-server (AOF everysec)"
    )
    return system


def start_channels(ctx: JobsContext, args) -> JobSystem:
    redis_server = RedisServer().start()
    ctx.redis.append(redis_server)
    db = ctx.databases["channels"]
    system = JobSystem(
        "channels",
        free_port(),
        ctx.log_dir / "exec-channels.log",
        redis=redis_server,
        post_path="/bench/channels/jobs/",
        ws_prefix="/ws/bench/channels/",
        socket_first=True,
        databases=[db],
    )
    ctx.started.append(system)
    env = django_env(
        "channels", ctx.db_url(db), redis_server.url, system.exec_log, args, BENCH_CONN_MAX_AGE="300"
    )
    web_env = web_settings(env, args)
    system.children = [
        start(
            "channels-web", uvicorn_command("bench.jobs_asgi:application", system.port), web_env, ctx.log_dir
        ),
        start("channels-worker", celery_command("channels", args.workers), env, ctx.log_dir, " ready."),
    ]
    system.description = (
        f"uvicorn bench.jobs_asgi (Channels' AuthMiddlewareStack), Celery prefork x{args.workers}, "
        "channels_redis RedisChannelLayer, redis-server (no persistence)"
    )
    return system


def start_dbos(ctx: JobsContext, args) -> JobSystem:
    db, sys_db = ctx.databases["dbos"], ctx.databases["dbos_sys"]
    system = JobSystem(
        "dbos",
        free_port(),
        ctx.log_dir / "exec-dbos.log",
        post_path="/bench/dbos/jobs/",
        ws_prefix="/ws/bench/dbos/",
        socket_first=False,
        databases=[db, sys_db],
    )
    dbos_env = {
        "BENCH_DBOS_URL": ctx.db_url(sys_db, scheme="postgresql"),
        "BENCH_DBOS_POLLING": str(args.dbos_polling),
        "BENCH_DBOS_POOL": str(args.dbos_pool),
    }
    if args.dbos_worker_concurrency:
        dbos_env["BENCH_DBOS_WORKER_CONCURRENCY"] = str(args.dbos_worker_concurrency)
    # No Redis: a port nothing listens on, so that any use of one would show as an error.
    env = django_env("dbos", ctx.db_url(db), "redis://127.0.0.1:9/0", system.exec_log, args, **dbos_env)

    def worker(i: int) -> Process:
        command = [sys.executable, "-m", "bench.jobs_dbos"]
        return start(
            f"dbos-worker-{i}",
            command,
            {**env, "BENCH_DBOS_EXECUTOR": f"bench-{i}"},
            ctx.log_dir,
            "dbos worker ready",
        )

    # The first worker creates the system database's tables (DBOS migrates at launch); then the rest.
    ctx.started.append(system)
    system.children = [worker(1)]
    wait_for(system.children[0].ready, timeout=90, interval=0.1, message="the first DBOS worker")
    system.children += [worker(i) for i in range(2, args.workers + 1)]
    system.children.append(
        start(
            "dbos-web",
            uvicorn_command("bench.jobs_asgi:application", system.port),
            web_settings(env, args),
            ctx.log_dir,
        )
    )
    concurrency = args.dbos_worker_concurrency or "unlimited"
    system.description = (
        f"uvicorn bench.jobs_asgi (DBOSClient, LISTEN/NOTIFY), {args.workers} DBOS worker processes "
        f"(queue polling {args.dbos_polling:g} s, worker concurrency {concurrency}), no Redis"
    )
    return system


# --- databases --------------------------------------------------------------------------------


class JobsContext(Context):
    """The run's databases (a copy of the template per system and DBOS's system database), log
    folder and the bench's user."""

    def __init__(self, server_url: str, log_dir: Path):
        super().__init__(server_url, log_dir, f"bench_jobs_{os.getpid()}", (*SYSTEMS, "dbos_sys"))
        self.token = self.session = ""
        self.user_pk = 0
        self.ours_redis: RedisServer | None = None
        self.rows: dict[str, dict[str, int]] = {}

    def prepare_all(self) -> None:
        """The template: migrated, with the bench's user, its token and a logged-in session; then
        each system's copy of it and DBOS's empty system database."""
        self.prepare(self.migrate, SYSTEMS)
        self.create(self.databases["dbos_sys"])

    def migrate(self, template_url: str) -> None:
        os.environ["DATABASE_URL"] = template_url
        import django

        django.setup()
        from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
        from django.contrib.sessions.backends.db import SessionStore
        from django.core.management import call_command
        from django.db import connections
        from rest_framework.authtoken.models import Token

        call_command("migrate", verbosity=0, interactive=False)
        user = get_user_model().objects.create_user("bench", password=None)
        session = SessionStore()
        session[SESSION_KEY] = str(user.pk)
        session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.save()
        assert session.session_key is not None
        self.token, self.session, self.user_pk = (
            Token.objects.create(user=user).key,
            session.session_key,
            user.pk,
        )
        connections.close_all()

    def before_drop(self) -> None:
        # Every backend has exited, its statistics flushed: the counts are whole.
        self.rows = {
            system.name: self.rows_written(system.databases)
            for system in self.started
            if isinstance(system, JobSystem)
        }

    def rows_written(self, names: list[str]) -> dict[str, int]:
        """Rows inserted, updated or deleted in each user table of these databases since they were
        created (pg_stat_user_tables: catalogs, so DDL, not counted), by `<database>.<table>`."""
        found: dict[str, int] = {}
        for name in names:
            rows = self.execute(
                "SELECT relname, n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables "
                "WHERE n_tup_ins + n_tup_upd + n_tup_del > 0",
                name,
            )
            label = name.removeprefix(f"{self.stem}_")
            for table, count in rows:
                found[f"{label}.{table}"] = int(count)
        return found


# --- the client -------------------------------------------------------------------------------


@dataclass
class JobResult:
    key: str
    job_id: str | None = None
    answers: list[tuple[int, bool, str | None]] = field(default_factory=list)  # (status, replayed, job_id)
    posted: float = 0.0
    first: float | None = None
    final: float | None = None
    seqs: list[int] = field(default_factory=list)
    other_frames: int = 0
    error: str | None = None

    def faults(self) -> tuple[int, int, int]:
        """(duplicates, lost, reordered) of the frames this job's socket got."""
        seen: set[int] = set()
        duplicates = reordered = high = 0
        for seq in self.seqs:
            if seq in seen:
                duplicates += 1
                continue
            if seq < high:
                reordered += 1
            seen.add(seq)
            high = max(high, seq)
        return duplicates, len(set(EXPECTED_SEQS) - seen), reordered


class Http(KeepAlive):
    """A keep-alive connection that POSTs jobs (keyed: sent again on a closed connection)."""

    def __init__(self, port: int, token: str):
        super().__init__(port)
        self.token = token

    async def post(self, path: str, key: str) -> tuple[int, dict, bytes]:
        body = json.dumps({"domain": DOMAIN, "payload": {"key": key}}).encode()
        request = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Authorization: Token {self.token}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json\r\nIdempotency-Key: {key}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        return await self.send(request, retry=True)


class Client:
    def __init__(self, ctx: JobsContext, run_id: str):
        self.ctx, self.run_id = ctx, run_id
        self.counter = 0

    def new_key(self, system: str, tag: str) -> str:
        self.counter += 1
        return f"{self.run_id}-{system}-{tag}-{self.counter}"

    async def connect(self, system: JobSystem, job_id: str):
        from websockets.asyncio.client import connect
        from websockets.typing import Origin

        return await connect(
            system.ws_url(job_id),
            origin=Origin(f"http://127.0.0.1:{system.port}"),
            additional_headers={"Cookie": f"sessionid={self.ctx.session}"},
            compression=None,
            proxy=None,
            ping_interval=None,
            open_timeout=30,
            close_timeout=5,
            max_queue=None,
        )

    async def job(
        self,
        system: JobSystem,
        http: Http,
        key: str,
        *,
        socket_first: bool,
        timeout: float,
        posts: int = 1,
        grace: float = 0.0,
    ) -> JobResult:
        """One job: (socket,) POST(s), (socket,) frames until the final one (and `grace` seconds
        more, to see a second execution's frames)."""
        from websockets.exceptions import ConnectionClosed

        result = JobResult(key)
        ws = None
        try:
            if socket_first:
                ws = await self.connect(system, f"u{self.ctx.user_pk}-{key}")
            result.posted = time.perf_counter()
            for _ in range(posts):
                status, headers, body = await http.post(system.post_path, key)
                job_id = json.loads(body).get("job_id") if status in (200, 201) else None
                result.answers.append((status, headers.get("idempotent-replayed") == "true", job_id))
                result.job_id = result.job_id or job_id
            if result.job_id is None:
                result.error = f"POST answered {result.answers[0][0]}"
                return result
            if ws is None:
                ws = await self.connect(system, result.job_id)
            deadline = result.posted + timeout
            while True:
                now = time.perf_counter()
                until = deadline if result.final is None else min(deadline, result.final + grace)
                if now >= until:
                    break
                try:
                    raw = await asyncio.wait_for(ws.recv(), until - now)
                except (TimeoutError, ConnectionClosed):
                    break
                frame = json.loads(raw)
                if frame.get("type") != "event":
                    result.other_frames += 1
                    continue
                if result.first is None:
                    result.first = time.perf_counter()
                result.seqs.append(int(frame["seq"]))
                data = frame.get("data")
                if isinstance(data, dict) and data.get("final") is True and result.final is None:
                    result.final = time.perf_counter()
                    if grace <= 0:
                        break
            if result.final is None:
                result.error = "no final frame"
        except Exception as exc:  # counted; the run goes on
            result.error = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            if ws is not None:
                try:
                    await ws.close()
                except Exception:
                    pass
        return result

    async def batch(
        self,
        system: JobSystem,
        count: int,
        concurrency: int,
        tag: str,
        *,
        socket_first: bool | None = None,
        timeout: float = 30.0,
        posts: int = 1,
        grace: float = 0.0,
    ) -> tuple[list[JobResult], float]:
        """`count` jobs by `concurrency` clients, each with its own HTTP connection; the results
        and the seconds from the first POST to the last job's end."""
        first = system.socket_first if socket_first is None else socket_first
        keys = collections.deque(self.new_key(system.name, tag) for _ in range(count))
        results: list[JobResult] = []

        async def client() -> None:
            http = Http(system.port, self.ctx.token)
            try:
                while keys:
                    key = keys.popleft()
                    results.append(
                        await self.job(
                            system, http, key, socket_first=first, timeout=timeout, posts=posts, grace=grace
                        )
                    )
            finally:
                http.close()

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(min(concurrency, count))))
        ended = max((r.final for r in results if r.final is not None), default=time.perf_counter())
        return results, ended - began


# --- measuring --------------------------------------------------------------------------------


@dataclass
class Run:
    system: str
    tag: str
    results: list[JobResult]
    seconds: float
    cpu_stack: dict[str, float]  # CPU seconds of the system's processes and Redis, by component
    cpu_postgres: float  # of the PostgreSQL server (all of it)
    cpu_client: float  # of this process (the clients)

    @property
    def completed(self) -> int:
        return sum(r.final is not None for r in self.results)

    @property
    def rate(self) -> float:
        return self.completed / self.seconds if self.seconds else 0.0

    def latencies(self) -> list[float]:
        return [r.first - r.posted for r in self.results if r.first is not None]

    def faults(self) -> dict[str, int]:
        totals: collections.Counter[str] = collections.Counter()
        for r in self.results:
            duplicates, lost, reordered = r.faults()
            totals.update(duplicates=duplicates, lost=lost, reordered=reordered, other_frames=r.other_frames)
            totals["errors"] += r.error is not None
        return {k: totals[k] for k in ("duplicates", "lost", "reordered", "other_frames", "errors")}

    def error_sample(self) -> str | None:
        return next((r.error for r in self.results if r.error), None)


def measure(system: JobSystem, client: Client, count: int, concurrency: int, tag: str, **options) -> Run:
    cpu_before, pg_before, own_before = system.cpu(), postgres_cpu(), time.process_time()
    results, seconds = asyncio.run(client.batch(system, count, concurrency, tag, **options))
    cpu_after, pg_after, own_after = system.cpu(), postgres_cpu(), time.process_time()
    stack: dict[str, float] = collections.defaultdict(float)
    for (component, pid), used in cpu_after.items():
        stack[component] += used - cpu_before.get((component, pid), 0.0)
    return Run(system.name, tag, results, seconds, dict(stack), pg_after - pg_before, own_after - own_before)


def executions(path: Path) -> collections.Counter[tuple[str, str]]:
    """(key, stage) -> how many times it ran, from a system's execution log."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return counts
    for line in lines:
        key, _, stage = line.partition(" ")
        counts[key, stage] += 1
    return counts


def write_counts(path: Path) -> collections.Counter[str]:
    """Write statements by table, from a system's write log (bench/jobs_stages.py)."""
    try:
        return collections.Counter(path.read_text().split())
    except OSError:
        return collections.Counter()


def second_executions(counts: collections.Counter, keys: list[str]) -> int:
    """Runs of these jobs beyond the first (the first stage's count, less one, per job)."""
    return sum(max(0, counts[key, STAGES[0]] - 1) for key in keys)


def guarantee_probes(system: JobSystem, client: Client, args) -> dict:
    """Socket opened after the POST answered; keys POSTed twice."""
    late, _ = asyncio.run(
        client.batch(
            system, args.probe_jobs, args.concurrency, "late", socket_first=False, timeout=args.probe_timeout
        )
    )
    retried, _ = asyncio.run(
        client.batch(
            system,
            args.retried,
            args.concurrency,
            "retry",
            timeout=args.job_timeout,
            posts=2,
            grace=args.grace,
        )
    )
    time.sleep(args.grace)  # a second execution still running finishes before the log is read
    counts = executions(system.exec_log)

    def faults(results: list[JobResult]) -> dict[str, int]:
        total: collections.Counter[str] = collections.Counter()
        for r in results:
            duplicates, lost, reordered = r.faults()
            total.update(duplicates=duplicates, lost=lost, reordered=reordered)
            total["no_final"] += r.final is None
        return dict(total)

    answers = [a for r in retried for a in r.answers]
    return {
        "late": {
            "jobs": len(late),
            **faults(late),
            "error_sample": next((r.error for r in late if r.error), None),
        },
        "retried": {
            "keys": len(retried),
            "second_executions": second_executions(counts, [r.key for r in retried]),
            "replayed_answers": sum(replayed for _, replayed, _ in answers),
            "second_answers_2xx": sum(200 <= r.answers[1][0] < 300 for r in retried if len(r.answers) > 1),
            "distinct_job_ids": sum(len({a[2] for a in r.answers}) for r in retried),
            **faults(retried),
        },
    }


# --- the profile ------------------------------------------------------------------------------

# ours' processes under py-spy, by kind: the child's name, and whether its children are the ones
# that work (a Celery prefork pool: the tasks run in the pool's processes, the main one consumes).
PROFILED = {"web": ("ours-web", False), "worker": ("ours-worker", True), "router": ("ours-router", False)}


def profile_round(system: JobSystem, client: Client, args) -> dict:
    """One more round of ours, not counted, with py-spy (--nonblocking, --gil, --function) on the web
    server, the Celery worker with its pool and the router: CPU ms per job by function and by
    package, per process kind (the pool's children apart from the worker's main process), next
    to the CPU /proc counted for each kind during the round."""
    children = {child.name: child for child in system.children}
    pids = {kind: children[name].pid for kind, (name, _) in PROFILED.items()}
    profilers = {
        kind: Profiler(
            f"ours-{kind}",
            pids[kind],
            None,
            client.ctx.log_dir,
            rate=args.profile_rate,
            subprocesses=pool,
            function=True,
            gil=True,  # the GIL's holder only: a thread waiting for a core or the GIL is no CPU
        )
        for kind, (_, pool) in PROFILED.items()
    }
    time.sleep(2.0)  # attaching stalls the target a moment; the pool's children are found by then
    before = system.cpu()
    run = measure(system, client, args.profile_jobs, args.concurrency, "prof")
    after = system.cpu()
    paths = {kind: profiler.stop() for kind, profiler in profilers.items()}
    jobs = max(1, run.completed)

    def kind_of(component: str, pid: int | None) -> str:
        if component == "worker" and pid is not None:
            return "worker (main)" if pid == pids["worker"] else "worker (pool)"
        return component

    counted: dict[str, float] = collections.defaultdict(float)
    for (component, pid), used in after.items():
        counted[kind_of(component, pid)] += 1000 * (used - before.get((component, pid), 0.0)) / jobs
    kinds: dict[str, dict] = {}
    kept = []
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for kind, path in paths.items():
        found = cpu_profile(
            path,
            args.profile_rate,
            jobs,
            kind=functools.partial(kind_of, kind),
            cpu_ms=counted,
        )
        kinds.update({kind: found} if "error" in found else found)
        if path.exists():  # the raw profiles, for a flame graph (py-spy's raw: flamegraph.pl's input)
            RESULTS_DIR.mkdir(exist_ok=True)
            kept.append(str(shutil.copy(path, RESULTS_DIR / f"jobs-{stamp}-py-spy-{kind}.txt")))
    return {
        "jobs": run.completed,
        "rate": run.rate,
        "py_spy_rate": args.profile_rate,
        "faults": run.faults(),
        "kinds": kinds,
        "proc_ms_per_job": dict(counted),
        "raw": kept,
    }


def profile_text(profile: dict) -> list[str]:
    """The profiled round as a report section."""
    return [
        "## Where ours' CPU goes (py-spy, one more round, not counted)",
        "",
        f"{profile['jobs']} jobs at {profile['rate']:.1f} jobs/s (slowed by the profiler), py-spy "
        f"--nonblocking --gil --function at {profile['py_spy_rate']} Hz (idle threads left out) on the web "
        "server, the Celery worker (its pool's processes, where the tasks run, apart from its main "
        "process, which consumes the broker) and the router. CPU ms per job: each kind's CPU as /proc "
        "counted it over the round, shared by py-spy's working samples. py-spy samples a runnable "
        "thread whether or not it has a core, so on a busy machine its own count (beside it) is "
        "higher; --gil keeps only the thread holding the GIL (one per process at a time), which keeps "
        "the waiting for a core, or for the GIL, out of the shares; time spent with the GIL released "
        "(system calls, libpq) is then shared among the rest. Leaves where a thread waits are set "
        "aside (bench/profiling.py's WAITING). Functions as module:function:first line; a package's "
        "self time is its own frames', its inclusive time that of the samples with any of its frames "
        "on the stack (bench's inclusive time holds every SQL statement: its write counter wraps "
        "Django's execute).",
        "",
        *cpu_profile_markdown(profile["kinds"]),
        "Raw profiles (py-spy's raw format, flamegraph.pl's input): "
        + ", ".join(f"`{Path(path).relative_to(ROOT)}`" for path in profile["raw"]),
        "",
    ]


# --- the report -------------------------------------------------------------------------------


def summarise(
    runs: dict[str, list[Run]],
    counts: dict[str, collections.Counter],
    writes: dict[str, collections.Counter],
    rows: dict[str, dict],
) -> dict:
    summary: dict[str, dict] = {}
    for name, measured in runs.items():
        best = max(measured, key=lambda run: run.rate)
        latencies = [x for run in measured for x in run.latencies()]
        faults: collections.Counter[str] = collections.Counter()
        for run in measured:
            faults.update(run.faults())
        jobs = sum(len(run.results) for run in measured)
        completed = sum(run.completed for run in measured)
        keys = [r.key for run in measured for r in run.results]
        stage_runs = sum(counts[name].values())
        written = sum(rows[name].values())
        job_runs = sum(n for (_, stage), n in counts[name].items() if stage == STAGES[0])
        summary[name] = {
            "rate": best.rate,
            "rates": [run.rate for run in measured],
            "median_rate": median(run.rate for run in measured),
            "p50_ms": percentile(latencies, 0.50) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000,
            "jobs": jobs,
            "completed": completed,
            "faults": dict(faults),
            "error_sample": next((run.error_sample() for run in measured if run.error_sample()), None),
            "second_executions": second_executions(counts[name], keys),
            "cpu_stack_ms": 1000 * sum(sum(run.cpu_stack.values()) for run in measured) / max(1, completed),
            "cpu_by_component_ms": {
                component: 1000
                * sum(run.cpu_stack.get(component, 0.0) for run in measured)
                / max(1, completed)
                for component in sorted({c for run in measured for c in run.cpu_stack})
            },
            "cpu_client_ms": 1000 * sum(run.cpu_client for run in measured) / max(1, completed),
            "cpu_postgres_ms": 1000 * sum(run.cpu_postgres for run in measured) / max(1, completed),
            "stage_runs": stage_runs,
            "job_runs": job_runs,
            "writes": sum(writes[name].values()),
            "writes_per_stage": sum(writes[name].values()) / stage_runs if stage_runs else float("nan"),
            "writes_by_table": dict(writes[name].most_common()),
            "rows_written": written,
            "rows_per_stage": written / stage_runs if stage_runs else float("nan"),
            "rows_by_table": dict(sorted(rows[name].items(), key=lambda item: -item[1])),
        }
    return summary


def render(summary: dict, probes: dict, args, info: dict) -> tuple[str, list[tuple[str, bool]]]:
    ours = summary["ours"]["rate"]
    verdicts = []
    rows = []
    alone, baseline = summary["ours"]["alone_p50_ms"], summary[ALONE_P50_BASELINE]["alone_p50_ms"]
    alone_verdict = (
        f"POST -> first frame with one client, p50: ours {alone:.1f} ms, {NAMES[ALONE_P50_BASELINE]} "
        f"{baseline:.1f} ms (target: ours <= {NAMES[ALONE_P50_BASELINE]}')",
        alone <= baseline,
    )
    for name in SYSTEMS:
        s = summary[name]
        f = s["faults"]
        vs = target = ""
        if name == "ours":
            target = f"one client p50 <= {NAMES[ALONE_P50_BASELINE]}' {verdict(alone_verdict[1])}"
        if name in TARGETS:
            value = ratio(ours, s["rate"])
            ok = value >= TARGETS[name]
            verdicts.append((f"ours / {NAMES[name]}: {value:.2f}x jobs/s (target >= {TARGETS[name]:g}x)", ok))
            vs, target = f"{value:.2f}x", f">= {TARGETS[name]:g}x {verdict(ok)}"
        errors = f" ({f['errors']} jobs failed: {s['error_sample']})" if f.get("errors") else ""
        rows.append(
            (
                NAMES[name],
                f"{s['rate']:.1f}",
                " / ".join(f"{r:.1f}" for r in s["rates"]),
                vs,
                target,
                f"{s['p50_ms']:.0f} / {s['p99_ms']:.0f}",
                f"{s['alone_p50_ms']:.0f} / {s['alone_p99_ms']:.0f}",
                f"{f['duplicates']} / {f['lost']} / {f['reordered']}{errors}",
                str(s["second_executions"]),
                f"{s['cpu_stack_ms']:.1f} + {s['cpu_postgres_ms']:.1f}",
                f"{s['writes_per_stage']:.2f}",
            )
        )
    header = (
        "system",
        "jobs/s (best)",
        "all rounds, jobs/s",
        "ours / it",
        "target",
        f"POST -> first frame p50 / p99 ms, {args.concurrency} clients",
        "the same, one client",
        "frames duplicated / lost / reordered",
        "second executions",
        "CPU ms/job: stack + PostgreSQL",
        "DB writes / stage",
    )
    lines = markdown_table(header, "lrlrlrrrrrr", rows)
    verdicts.append(alone_verdict)
    # The target: database writes per finished stage <= 1, counted as tests/eventbus/test_stage_writes.py
    # counts them: the stage records' write statements, less the one per job that starts its first
    # stage, per stage run (the job's own row and its idempotency record are the job's, not a stage's).
    o = summary["ours"]
    stage_writes = o["writes_by_table"].get("eventbus_stagerecord", 0)
    per_stage = (stage_writes - o["job_runs"]) / max(1, o["stage_runs"])
    verdicts.append(
        (
            f"ours: database writes per finished stage {per_stage:.2f} (eventbus_stagerecord: "
            f"{stage_writes / max(1, o['job_runs']):.2f} write statements per job of {len(STAGES)} stages, "
            f"the first stage's start one of them; all of ours' writes: {o['writes_per_stage']:.2f} per stage) "
            "(target <= 1)",
            per_stage <= 1,
        )
    )
    guarantees = [
        f"| system | socket opened after the POST answered ({args.probe_jobs} jobs): frames duplicated / lost "
        f"/ reordered, jobs without their final frame | retried POSTs ({args.retried} keys, each POSTed twice): "
        "second executions / answers marked replayed / duplicated frames |",
        "|---|---|---|",
    ]
    for name in SYSTEMS:
        late, retried = probes[name]["late"], probes[name]["retried"]
        guarantees.append(
            f"| {NAMES[name]} | {late.get('duplicates', 0)} / {late.get('lost', 0)} / {late.get('reordered', 0)}, "
            f"{late.get('no_final', 0)} | {retried['second_executions']} / {retried['replayed_answers']} / "
            f"{retried.get('duplicates', 0)} |"
        )
    text = "\n".join(lines) + "\n\n" + "\n".join(guarantees) + "\n\n"
    text += "\n".join(f"{verdict(ok)}  {label}" for label, ok in verdicts)
    text += (
        f"\n\nload average (1, 5, 15 min): {info['load_before']} before, {info['load_after']} after; "
        f"{info['nproc']} CPUs ({info['cpu']})"
    )
    return text, verdicts


def report(
    text: str, summary: dict, probes: dict, descriptions: dict, args, info: dict, profile: dict
) -> str:
    tables = []
    for name in SYSTEMS:
        jobs = max(1, summary[name]["job_runs"])
        statements = ", ".join(
            f"{table} {n / jobs:.2f}" for table, n in summary[name]["writes_by_table"].items()
        )
        rows = ", ".join(f"{table} {n / jobs:.2f}" for table, n in summary[name]["rows_by_table"].items())
        tables.append(f"- {NAMES[name]}: write statements {statements or 'none'}; rows {rows or 'none'}")
    cpu = []
    for name in SYSTEMS:
        parts = ", ".join(f"{c} {ms:.1f}" for c, ms in summary[name]["cpu_by_component_ms"].items())
        cpu.append(
            f"- {NAMES[name]}: {parts}; PostgreSQL {summary[name]['cpu_postgres_ms']:.1f}; "
            f"the clients (this process) {summary[name]['cpu_client_ms']:.1f}"
        )
    return f"""# Jobs end to end (the headline)

Command: `{info["command"]}` ({info["when"]}; {info["seconds"]:.0f} s)

Machine: {info["nproc"]} CPUs ({info["cpu"]}), load average {info["load_before"]} before, {info["load_after"]}
after (1, 5, 15 min; other work shares this machine); Python {info["python"]}, Django {info["django"]},
{info["database"]}, Redis {info["redis"]}; Celery {info["celery"]}, channels {info["channels"]},
channels-redis {info["channels_redis"]}, dbos {info["dbos"]}, uvicorn {info["uvicorn"]}.

Each system: {args.workers} worker processes, {args.jobs} jobs per round by {args.concurrency} concurrent
clients, {args.rounds} rounds interleaved (rotating order) after {args.warmup} warm-up jobs, the best
round kept (all listed); the others paused (SIGSTOP) while one is measured: {"yes" if args.pause else "no"};
stage work: {args.stage_ms:g} ms of sleep per stage. Database connections: the Django ASGI servers of
all three {f"take them from Django's psycopg pool (at most {args.db_pool} each)" if args.db_pool else "open one per request (no pool)"},
the Celery workers keep theirs (CONN_MAX_AGE 300), DBOS's processes use its SQLAlchemy pools
({args.dbos_pool} per process).

## Results

{text}

## What each system is

- **ours**: {descriptions["ours"]}. `POST /api/jobs/` (token, `Idempotency-Key`; the idempotency
  middleware, the Job and its task enqueued on commit), the Celery task runs the four stages
  (each recorded, each publishing its event through publish.lua), `run_router` routes them
  (ordered state, history, PUBLISH), the gateway's socket `/ws/jobs/<job_id>/` (session cookie),
  opened once the POST answered, backfills from the history and then streams live.
- **Celery + Channels** (baseline a): {descriptions["channels"]}. `POST /bench/channels/jobs/` (a DRF
  view, token auth, no idempotency) enqueues a Celery task that runs the four stages, sending each
  frame with `async_to_sync(channel_layer.group_send)("job-<id>", ...)`; the consumer at
  `/ws/bench/channels/<job_id>/` joins the group and forwards. The job's id is derived from the
  client's key, so the client opens its socket first, then POSTs: that is what makes its main
  runs lose nothing.
- **DBOS Transact** (baseline b): {descriptions["dbos"]}. `POST /bench/dbos/jobs/` (a DRF view, token
  auth) enqueues the workflow `bench_job` on the queue `bench-jobs` through a `DBOSClient`, with
  the Idempotency-Key (scoped by user) as its workflow id (SetWorkflowID's equivalent for a client);
  a worker process (running its workflows in threads, as many at once as it dequeued, where a
  Celery prefork process runs one task at a time) runs four `@DBOS.step()`s, writing each frame
  with `DBOS.write_stream`, then the final
  one and `close_stream`; the consumer at `/ws/bench/dbos/<job_id>/`, opened once the POST
  answered, reads the stream from its start (`read_stream_async`) and forwards it.

Frames are the same in all three (`{{"type": "event", "seq", "stage", "data"}}`, seq 10, 20, 30,
40 and the final 51 with `data.final`); the client checks each job's: a seq seen before is a
duplicate, one below a seq already seen is reordered, an expected seq never seen is lost.
Second executions come from the stages' own execution log (a line per stage run, whatever the
system did). CPU per completed job, the measured rounds: the system's processes and its Redis;
PostgreSQL's is the whole server's (exited backends included, other databases' work too), in ms:

{chr(10).join(cpu)}

DB writes: INSERT, UPDATE and DELETE statements of every process of the system (Django's
connections and SQLAlchemy's engines log each one), the whole run (warm-up and probes included),
per stage executed; and the rows they wrote (pg_stat_user_tables: inserted + updated + deleted,
catalogs not counted); per job, by table:

{chr(10).join(tables)}

Guarantee probes: {args.probe_jobs} jobs whose socket opens only after the POST answered (ours'
and DBOS's order in every run; for baseline (a) the order that loses frames: events sent before
the socket joined the group are gone), watched for {args.probe_timeout:g} s at most; and
{args.retried} keys each POSTed twice, the second right after the first answer, the socket watched
{args.grace:g} s past the final frame.
""" + ("\n" + "\n".join(profile_text(profile)) if profile else "")


# --- main -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=300, help="jobs per system and round")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="worker processes of each system")
    parser.add_argument("--warmup", type=int, default=32, help="warm-up jobs per system")
    parser.add_argument(
        "--stage-ms", type=float, default=0.0, help="sleep per stage, ms (the same in all three)"
    )
    parser.add_argument("--job-timeout", type=float, default=30.0, help="seconds a job may take")
    parser.add_argument(
        "--latency-jobs", type=int, default=30, help="jobs run one at a time (POST -> first frame unloaded)"
    )
    parser.add_argument("--probe-jobs", type=int, default=20, help="jobs whose socket opens after the POST")
    parser.add_argument("--probe-timeout", type=float, default=3.0, help="seconds each of those is watched")
    parser.add_argument("--retried", type=int, default=10, help="keys POSTed twice")
    parser.add_argument(
        "--grace", type=float, default=1.0, help="seconds a socket is watched past the final frame"
    )
    parser.add_argument(
        "--dbos-polling",
        type=float,
        default=0.1,
        help="DBOS queue polling interval, s (DBOS's default: 1; of 1, 0.1 and 0.02, 0.1 gave DBOS its best jobs/s)",
    )
    parser.add_argument(
        "--dbos-worker-concurrency",
        type=int,
        default=0,
        help="workflows per DBOS worker at once (0: no limit)",
    )
    parser.add_argument(
        "--db-pool",
        type=int,
        default=8,
        help="the Django ASGI servers' psycopg pool size, all three systems (0: no pool, a connection per request)",
    )
    parser.add_argument("--dbos-pool", type=int, default=10, help="DBOS system database pool per process")
    parser.add_argument(
        "--no-pause", dest="pause", action="store_false", help="leave the other systems running during a run"
    )
    parser.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one more round of ours, not counted, under py-spy: CPU ms/job by function and package, "
        "web, worker (pool and main) and router",
    )
    parser.add_argument("--profile-jobs", type=int, help="jobs of the profiled round (default: --jobs)")
    parser.add_argument("--profile-rate", type=int, default=200, help="py-spy samples/s")
    parser.add_argument("--only", help="comma-separated systems (development); no report")
    parser.add_argument("--no-report", action="store_true", help="do not write bench/REPORT-jobs.md")
    args = parser.parse_args()
    chosen = [s for s in SYSTEMS if not args.only or s in args.only.split(",")]
    args.profile_jobs = args.profile_jobs or args.jobs
    if args.profile and "ours" in chosen and not (shutil.which("py-spy") or (BIN / "py-spy").exists()):
        print("py-spy is missing (bench/requirements.txt): --no-profile, or install it", file=sys.stderr)
        return 2

    begun = setup("jobs", ("dbos", "channels_redis", "websockets"), " (DBOS and the targets)")
    if begun is None:
        return 2
    log_dir = begun.log_dir
    ctx = JobsContext(begun.database.postgres_url, log_dir)
    systems: dict[str, JobSystem] = {}
    with running(ctx):
        starters = {"ours": start_ours, "channels": start_channels, "dbos": start_dbos}
        # ours' Redis first: this process's Django (migrate, the router's streams) reads its URL.
        ctx.ours_redis = RedisServer(durable=True).start()
        ctx.redis.append(ctx.ours_redis)
        os.environ.update(
            DJANGO_SETTINGS_MODULE="bench.jobs_settings",
            BENCH_JOBS_SYSTEM="ours",
            LOG_LEVEL="WARNING",
            REDIS_URL=ctx.ours_redis.url,
        )
        ctx.prepare_all()
        for name in chosen:
            systems[name] = starters[name](ctx, args)
        for system in systems.values():
            wait_ready(system)
        print(f"started: {', '.join(systems)}; logs in {log_dir}", flush=True)
        gc.collect()
        gc.freeze()

        client = Client(ctx, uuid.uuid4().hex[:8])

        def alone(name: str) -> JobSystem:
            """Resume this system, pause the others (unless --no-pause)."""
            return only(systems, name, args.pause)

        for name in systems:
            run = measure(alone(name), client, args.warmup, args.concurrency, "warm")
            print(f"  warm-up {name:9} {run.rate:7.1f} jobs/s  {run.faults()}", flush=True)
        runs: dict[str, list[Run]] = {name: [] for name in systems}
        for rnd in range(args.rounds):
            names = list(systems)
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            print(f"round {rnd + 1}/{args.rounds}: {', '.join(order)}", flush=True)
            for name in order:
                run = measure(alone(name), client, args.jobs, args.concurrency, f"r{rnd}")
                systems[name].check_alive()
                runs[name].append(run)
                lat = run.latencies()
                print(
                    f"  {name:9} {run.rate:7.1f} jobs/s  POST->first frame p50 {percentile(lat, 0.5) * 1000:6.1f} "
                    f"ms p99 {percentile(lat, 0.99) * 1000:6.1f} ms  CPU ms/job "
                    + " ".join(
                        f"{c} {1000 * v / max(1, run.completed):.1f}"
                        for c, v in sorted(run.cpu_stack.items())
                    )
                    + f" PG {1000 * run.cpu_postgres / max(1, run.completed):.1f}"
                    f" client {1000 * run.cpu_client / max(1, run.completed):.1f}  {run.faults()}",
                    flush=True,
                )
        latency: dict[str, Run] = {}
        for name in systems:
            latency[name] = measure(alone(name), client, args.latency_jobs, 1, "lat")
            lat = latency[name].latencies()
            print(
                f"  one client {name:9} POST->first frame p50 {percentile(lat, 0.5) * 1000:6.1f} ms "
                f"p99 {percentile(lat, 0.99) * 1000:6.1f} ms  {latency[name].faults()}",
                flush=True,
            )
        profile: dict = {}
        if args.profile and "ours" in systems:
            profile = profile_round(alone("ours"), client, args)
            print(f"  profiled round ours {profile['rate']:7.1f} jobs/s (not counted)  {profile['faults']}")
            print("\n".join(profile_text(profile)), flush=True)
        probes = {}
        for name in systems:
            probes[name] = guarantee_probes(alone(name), client, args)
            print(f"  probes {name:9} {probes[name]}", flush=True)
        for system in systems.values():
            system.resume()
            system.check_alive()
        descriptions = {name: system.description for name, system in systems.items()}
        redis = redis_version(systems)

    counts = {name: executions(system.exec_log) for name, system in systems.items()}
    writes = {name: write_counts(system.exec_log.with_name(f"writes-{name}.log")) for name in systems}
    if args.only:
        shutil.rmtree(log_dir, ignore_errors=True)
        return 0
    summary = summarise(runs, counts, writes, ctx.rows)
    for name, run in latency.items():
        lat = run.latencies()
        summary[name]["alone_p50_ms"] = percentile(lat, 0.50) * 1000
        summary[name]["alone_p99_ms"] = percentile(lat, 0.99) * 1000
        summary[name]["alone_faults"] = run.faults()
    info = begun.info(ctx, redis, "celery", "channels", "channels-redis", "dbos", "uvicorn", "websockets")
    text, verdicts = render(summary, probes, args, info)
    print()
    print(text)
    raw = write_raw("jobs", info=info, args=vars(args), summary=summary, probes=probes, profile=profile)
    if not args.no_report:
        REPORT.write_text(report(text, summary, probes, descriptions, args, info, profile))
        print(f"\nwritten to {REPORT.relative_to(ROOT)} (raw figures: {raw.relative_to(ROOT)})")
    shutil.rmtree(log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
