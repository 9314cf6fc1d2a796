#!/usr/bin/env python
"""Django's tasks end to end: a script, never a test.

    make bench-tasks BENCH_TASKS_ARGS="--tasks 300 --clients 16 --rounds 3"
    .venv/bin/python bench/tasks.py [--tasks 300] [--clients 16] [--rounds 3] [--workers 2]
        [--warmup 32] [--poll-ms 10] [--after-ms 0] [--db-worker-interval 0.1] [--no-pause]
        [--only ours,dbtasks] [--no-report]

Tasks completed per second on this machine: a no-op task (bench/tasks_app.py) enqueued by a
Django view, run, and its result seen SUCCESSFUL from outside the worker. Each of --clients
concurrent clients POSTs the enqueue view, then polls the result view every --poll-ms until the
task is done, then starts the next; the same completion check in every system (its backend's
result as the web tier reads it: `get_result()` for Django's task API, `AsyncResult.state` for
Celery). Three systems side by side in one run, each with --workers worker processes and its own
web server (gunicorn gthread, bench/idempotency.py's), its own database on the same PostgreSQL
server (DATABASE_URL if it is PostgreSQL, else postgres://postgres@127.0.0.1:5432; copies of one
migrated template, dropped at the end) and its own redis-server:

- ours: TASKS' backend eventbus.backends.ExactlyOnceBackend; the view calls `noop.enqueue(key)`
  (Django 5.2 here: the django-tasks backport, through eventbus.djangotasks.compat); a Celery
  worker (prefork, --workers processes), `run_router` and `sweep_jobs` (what run_jobs starts for
  jobs, less the reclaimer and scheduler the bench has no use for), a durable redis-server (AOF).
  Measured three ways on the same processes: plain; `run_after` set (`.using(run_after=now +
  --after-ms)`: 0, the default, is due at once, already past at the commit); and priorities
  (`.using(priority=...)`, cycling 100, 0, -50, -100: one of each of the broker's four bands).
- dbtasks: django-tasks-db's DatabaseBackend, the same view and task; --workers `db_worker`
  processes (each runs one task at a time; --db-worker-interval is how long one sleeps when it
  finds no task ready: its default is 1 s). No Redis.
- celery: plain Celery, no guarantee: the view calls `noop_celery.delay(key)`, a Celery worker
  as ours' (prefork, --workers processes, the project's Celery settings: acks late, prefetch 1),
  Redis broker and Redis result backend (the system's own redis-server, no persistence).

Each system is warmed up, then measured --rounds times, the rounds interleaved in a rotating
order; while one is measured the others' processes are paused (SIGSTOP; --no-pause keeps them
running). The best round of each is kept (all are listed). Every run of the no-op appends its
key to its system's execution log: after the run, a key logged twice is a duplicate, a key whose
enqueue answered but never logged is lost.

Results are printed and written to bench/REPORT-tasks.md; raw figures go to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import gc
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness
from bench.harness import Context, System
from bench.idempotency import server_command
from bench.processes import Process
from bench.report import markdown_table, verdict
from bench.stats import median, percentile, ratio
from config.redis_server import RedisServer, free_port

REPORT = ROOT / "bench" / "REPORT-tasks.md"
STACKS = ("ours", "dbtasks", "celery")
# What is measured: (variant, the stack that runs it, the enqueue view's kind).
VARIANTS = {
    "ours": ("ours", "plain"),
    "ours-after": ("ours", "after"),
    "ours-prio": ("ours", "prio"),
    "dbtasks": ("dbtasks", "plain"),
    "celery": ("celery", "plain"),
}
NAMES = {
    "ours": "ours",
    "ours-after": "ours, run_after set",
    "ours-prio": "ours, mixed priorities",
    "dbtasks": "django-tasks-db",
    "celery": "plain Celery",
}
# The targets: ours' tasks/s over each baseline's.
TARGETS = {"dbtasks": 1.5, "celery": 0.7}
# Reported against ours plain, no target.
AGAINST_OURS = ("ours-after", "ours-prio")
ENQUEUE_PATH = "/bench/tasks/enqueue/"


# --- the systems ------------------------------------------------------------------------------


def django_env(stack: str, database_url: str, redis_url: str, exec_log: Path, args) -> dict:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="bench.tasks_settings",
        BENCH_TASKS_SYSTEM=stack,
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        BENCH_JOBS_EXEC_LOG=str(exec_log),
        BENCH_TASKS_AFTER_MS=str(args.after_ms),
        LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    for name in ("CELERY_BROKER_URL", "CACHE_URL", "BENCH_STAGE_MS", "BENCH_CELERY_DB_REUSE_MAX"):
        env.pop(name, None)
    if args.db_reuse_max is not None:
        env["BENCH_CELERY_DB_REUSE_MAX"] = str(args.db_reuse_max)
    return env


def migrate(args, template_url: str) -> None:
    """The template, migrated with every app of the three (django-tasks-db's table too, unused by
    the other two)."""
    env = django_env("dbtasks", template_url, "redis://127.0.0.1:9/0", Path(os.devnull), args)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True
    )


def web(name: str, port: int, env: dict, ctx: Context, args) -> tuple[Process, str]:
    command, description = server_command("gunicorn", port, args.web_workers, args.web_threads)
    return harness.start(f"{name}-web", command, env, ctx.log_dir), description


def start_ours(ctx: Context, args) -> System:
    redis_server = RedisServer(durable=True).start()
    ctx.redis.append(redis_server)
    system = System("ours", free_port(), ctx.log_dir / "exec-ours.log")
    system.redis = redis_server
    ctx.started.append(system)
    env = django_env("ours", ctx.db_url(ctx.databases["ours"]), redis_server.url, system.exec_log, args)
    server, described = web("ours", system.port, env, ctx, args)
    manage = [sys.executable, "manage.py"]
    system.children = [
        server,
        harness.start(
            "ours-worker", harness.celery_command("ours", args.workers), env, ctx.log_dir, " ready."
        ),
        harness.start("ours-router", [*manage, "run_router"], env, ctx.log_dir),
        # run_jobs' sweeper (its --interval on the default RECOVER_AFTER): sends delayed runs once due.
        harness.start("ours-sweeper", [*manage, "sweep_jobs", "--interval", "30"], env, ctx.log_dir),
    ]
    system.description = (
        f"{described}; Celery prefork x{args.workers}, run_router, sweep_jobs; redis-server (AOF everysec)"
    )
    return system


def start_dbtasks(ctx: Context, args) -> System:
    system = System("dbtasks", free_port(), ctx.log_dir / "exec-dbtasks.log")
    ctx.started.append(system)
    # No Redis: a port nothing listens on, so that any use of one would show as an error.
    env = django_env(
        "dbtasks", ctx.db_url(ctx.databases["dbtasks"]), "redis://127.0.0.1:9/0", system.exec_log, args
    )
    server, described = web("dbtasks", system.port, env, ctx, args)
    worker = [sys.executable, "manage.py", "db_worker", "--no-startup-delay"]
    worker += ["--interval", f"{args.db_worker_interval:g}"]
    system.children = [server] + [
        harness.start(f"dbtasks-worker-{i}", [*worker, "--worker-id", f"bench-{i}"], env, ctx.log_dir)
        for i in range(1, args.workers + 1)
    ]
    system.description = f"{described}; {args.workers} db_worker processes (--interval {args.db_worker_interval:g} s); no Redis"
    return system


def start_celery(ctx: Context, args) -> System:
    redis_server = RedisServer().start()
    ctx.redis.append(redis_server)
    system = System("celery", free_port(), ctx.log_dir / "exec-celery.log")
    system.redis = redis_server
    ctx.started.append(system)
    env = django_env("celery", ctx.db_url(ctx.databases["celery"]), redis_server.url, system.exec_log, args)
    server, described = web("celery", system.port, env, ctx, args)
    system.children = [
        server,
        harness.start(
            "celery-worker", harness.celery_command("celery", args.workers), env, ctx.log_dir, " ready."
        ),
    ]
    system.description = f"{described}; Celery prefork x{args.workers}; redis-server (broker and result backend, no persistence)"
    return system


def setup_django(ctx: Context, ours: System) -> None:
    """This process's Django, as ours' (router_ready reads the job types' streams from its settings)."""
    import django

    assert ours.redis is not None
    os.environ.update(
        DJANGO_SETTINGS_MODULE="bench.tasks_settings",
        BENCH_TASKS_SYSTEM="ours",
        DATABASE_URL=ctx.db_url(ctx.databases["ours"]),
        REDIS_URL=ours.redis.url,
        LOG_LEVEL="WARNING",
    )
    django.setup()


# --- the client -------------------------------------------------------------------------------


@dataclass
class TaskRun:
    key: str
    task_id: str | None = None
    enqueued: float = 0.0  # the enqueue POST sent
    answered: float | None = None  # its answer
    done: float | None = None  # the poll that saw it done
    polls: int = 0
    error: str | None = None


class Http(harness.KeepAlive):
    """A keep-alive connection that enqueues tasks and polls their results."""

    async def request(self, method: str, path: str) -> tuple[int, bytes]:
        raw = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            "Accept: application/json\r\nContent-Length: 0\r\n\r\n"
        ).encode()
        # An enqueue is never sent twice.
        status, _, body = await self.send(raw, retry=method != "POST")
        return status, body


async def one_task(http: Http, kind: str, key: str, poll: float, timeout: float) -> TaskRun:
    run = TaskRun(key, enqueued=time.perf_counter())
    try:
        status, body = await http.request("POST", f"{ENQUEUE_PATH}{kind}/{key}/")
        run.answered = time.perf_counter()
        if status != 201:
            run.error = f"enqueue answered {status}: {body[:100]!r}"
            return run
        run.task_id = json.loads(body)["id"]
        deadline = run.enqueued + timeout
        while time.perf_counter() < deadline:
            await asyncio.sleep(poll)
            status, body = await http.request("GET", f"/bench/tasks/result/{run.task_id}/")
            run.polls += 1
            if status == 200 and json.loads(body)["done"]:
                run.done = time.perf_counter()
                return run
        run.error = "not done in time"
    except Exception as exc:  # counted; the run goes on
        run.error = f"{type(exc).__name__}: {exc}"[:200]
    return run


async def batch(
    system: System, variant: str, kind: str, count: int, clients: int, args
) -> tuple[list[TaskRun], float]:
    """`count` tasks by `clients` clients, each on its own connection, one task at a time; the runs
    and the seconds from the first enqueue to the last task seen done."""
    tag = uuid.uuid4().hex[:6]
    keys = collections.deque(f"{variant}-{tag}-{i}" for i in range(count))
    runs: list[TaskRun] = []

    async def client() -> None:
        http = Http(system.port)
        try:
            while keys:
                runs.append(
                    await one_task(http, kind, keys.popleft(), args.poll_ms / 1000, args.task_timeout)
                )
        finally:
            http.close()

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(min(clients, count))))
    ended = max((r.done for r in runs if r.done is not None), default=time.perf_counter())
    return runs, ended - began


# --- measuring --------------------------------------------------------------------------------


@dataclass
class Round:
    variant: str
    runs: list[TaskRun]
    seconds: float
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds by component
    cpu_postgres: float = 0.0  # the whole PostgreSQL server's
    cpu_client: float = 0.0  # this process's (the clients)

    @property
    def completed(self) -> int:
        return sum(r.done is not None for r in self.runs)

    @property
    def rate(self) -> float:
        return self.completed / self.seconds if self.seconds else 0.0

    def latencies(self) -> list[float]:
        return [r.done - r.enqueued for r in self.runs if r.done is not None]

    def errors(self) -> int:
        return sum(r.error is not None for r in self.runs)

    def error_sample(self) -> str | None:
        return next((r.error for r in self.runs if r.error), None)


def measure(system: System, variant: str, count: int, args) -> Round:
    _, kind = VARIANTS[variant]
    cpu_before, pg_before, own_before = system.cpu(), harness.postgres_cpu(), time.process_time()
    runs, seconds = asyncio.run(batch(system, variant, kind, count, args.clients, args))
    cpu_after, pg_after, own_after = system.cpu(), harness.postgres_cpu(), time.process_time()
    used: dict[str, float] = collections.defaultdict(float)
    for (component, pid), seconds_used in cpu_after.items():
        used[component] += seconds_used - cpu_before.get((component, pid), 0.0)
    return Round(variant, runs, seconds, dict(used), pg_after - pg_before, own_after - own_before)


def executions(path: Path) -> collections.Counter[str]:
    """key -> how many times the no-op ran with it, from a system's execution log."""
    try:
        return collections.Counter(line.partition(" ")[0] for line in path.read_text().splitlines())
    except OSError:
        return collections.Counter()


def exactly_once(runs: list[TaskRun], counts: collections.Counter[str]) -> dict[str, int]:
    """Of the tasks whose enqueue answered: run more than once (the extra runs), never run."""
    accepted = [r.key for r in runs if r.task_id is not None]
    return {
        "accepted": len(accepted),
        "duplicates": sum(max(0, counts[key] - 1) for key in accepted),
        "lost": sum(counts[key] == 0 for key in accepted),
    }


# --- the report -------------------------------------------------------------------------------


def summarise(rounds: dict[str, list[Round]], checks: dict[str, dict]) -> dict:
    summary: dict[str, dict] = {}
    for variant, measured in rounds.items():
        best = max(measured, key=lambda r: r.rate)
        latencies = [x for r in measured for x in r.latencies()]
        completed = sum(r.completed for r in measured)
        components = sorted({c for r in measured for c in r.cpu})
        by_component = {
            c: 1000 * sum(r.cpu.get(c, 0.0) for r in measured) / max(1, completed) for c in components
        }
        summary[variant] = {
            "rate": best.rate,
            "rates": [r.rate for r in measured],
            "median_rate": median(r.rate for r in measured),
            "p50_ms": percentile(latencies, 0.50) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000,
            "tasks": sum(len(r.runs) for r in measured),
            "completed": completed,
            "errors": sum(r.errors() for r in measured),
            "error_sample": next((r.error_sample() for r in measured if r.error_sample()), None),
            "polls_per_task": sum(r.polls for m in measured for r in m.runs) / max(1, completed),
            "cpu_by_component_ms": by_component,
            "cpu_stack_ms": sum(by_component.values()),
            "cpu_postgres_ms": 1000 * sum(r.cpu_postgres for r in measured) / max(1, completed),
            "cpu_client_ms": 1000 * sum(r.cpu_client for r in measured) / max(1, completed),
            **checks[variant],
        }
    return summary


def render(summary: dict, args, info: dict) -> str:
    ours = summary.get("ours", {}).get("rate", 0.0)
    verdicts = []
    rows = []
    for variant, s in summary.items():
        vs = target = ""
        if variant in TARGETS and "ours" in summary:
            value = ratio(ours, s["rate"])
            ok = value >= TARGETS[variant]
            verdicts.append(
                f"{verdict(ok)}  ours / {NAMES[variant]}: {value:.2f}x tasks/s (target >= {TARGETS[variant]:g}x)"
            )
            vs, target = f"{value:.2f}x", f">= {TARGETS[variant]:g}x {verdict(ok)}"
        elif variant in AGAINST_OURS and "ours" in summary:
            vs, target = f"{ratio(ours, s['rate']):.2f}x", "reported"
        errors = f" ({s['errors']} failed: {s['error_sample']})" if s["errors"] else ""
        rows.append(
            (
                NAMES[variant],
                f"{s['rate']:.1f}",
                " / ".join(f"{r:.1f}" for r in s["rates"]),
                vs,
                target,
                f"{s['p50_ms']:.0f} / {s['p99_ms']:.0f}",
                f"{s['polls_per_task']:.1f}",
                f"{s['duplicates']} / {s['lost']} of {s['accepted']}{errors}",
                f"{s['cpu_stack_ms']:.2f} + {s['cpu_postgres_ms']:.2f}",
            )
        )
    header = (
        "system",
        "tasks/s (best)",
        "all rounds, tasks/s",
        "ours / it",
        "target",
        f"enqueue -> seen done p50 / p99 ms, {args.clients} clients",
        "result polls / task",
        "runs duplicated / lost, of tasks accepted",
        "CPU ms/task: stack + PostgreSQL",
    )
    text = "\n".join(markdown_table(header, "lrlrlrrrr", rows))
    text += "\n\n" + "\n".join(verdicts)
    text += (
        f"\n\nload average (1, 5, 15 min): {info['load_before']} before, {info['load_after']} after; "
        f"{info['nproc']} CPUs ({info['cpu']})"
    )
    return text


def report(text: str, summary: dict, descriptions: dict, args, info: dict) -> str:
    cpu = []
    for variant, s in summary.items():
        parts = ", ".join(f"{c} {ms:.2f}" for c, ms in s["cpu_by_component_ms"].items())
        cpu.append(
            f"- {NAMES[variant]}: {parts}; PostgreSQL {s['cpu_postgres_ms']:.2f}; "
            f"the clients (this process) {s['cpu_client_ms']:.2f}"
        )
    described = [f"- **{NAMES[name]}**: {descriptions[name]}." for name in STACKS if name in descriptions]
    after = (
        "due at once (run_after = now, already past when the enqueue commits: sent on commit, "
        "as a plain enqueue is)"
        if not args.after_ms
        else f"{args.after_ms:g} ms after the enqueue (sent by the sweeper once due)"
    )
    reuse = (
        f"CELERY_DB_REUSE_MAX {args.db_reuse_max} (--db-reuse-max: closed every {2 * args.db_reuse_max} tasks)"
        if args.db_reuse_max is not None
        else "the project's Celery settings (CELERY_DB_REUSE_MAX 1000: the workers keep their "
        "connections as CONN_MAX_AGE says, 300 s here)"
    )
    return f"""# Django's tasks end to end

Command: `{info["command"]}` ({info["when"]}; {info["seconds"]:.0f} s)

Machine: {info["nproc"]} CPUs ({info["cpu"]}), load average {info["load_before"]} before, {info["load_after"]}
after (1, 5, 15 min; other work shares this machine); Python {info["python"]}, Django {info["django"]},
{info["database"]}, Redis {info["redis"]}; django-tasks {info["django_tasks"]}, django-tasks-db
{info["django_tasks_db"]}, Celery {info["celery"]}, kombu {info["kombu"]}, gunicorn {info["gunicorn"]}.

Each system: {args.workers} worker processes, {args.tasks} tasks per round by {args.clients} concurrent
clients, {args.rounds} rounds interleaved (rotating order) after {args.warmup} warm-up tasks, the best
round kept (all listed); the others paused (SIGSTOP) while one is measured: {"yes" if args.pause else "no"}.
Celery workers' database connections: {reuse}.

Completion, the same in every system: the client POSTs the enqueue view (which answers the task's
id), then GETs the result view every {args.poll_ms:g} ms until it says done: Django's
`get_result(id)` status SUCCESSFUL (ours, django-tasks-db: read from the database), Celery's
`AsyncResult(id).state` SUCCESS (read from its Redis result backend); then it enqueues its next.
tasks/s: tasks seen done over the seconds from the round's first enqueue to its last task seen
done. `run_after`: {after}. Priorities: the enqueues cycle through 100, 0, -50 and -100.

## Results

{text}

## What each system is

{chr(10).join(described)}

The no-op (bench/tasks_app.py) appends its key to its system's execution log and returns None;
the view that enqueues it and the view that reads its result are plain Django views on the
project's middleware, one URLconf for the three systems. Duplicated: runs of a key past its
first; lost: keys whose enqueue answered and that never ran (read after the last round, warm-up
included). Ours claims exactly one run per enqueue, django-tasks-db one (a row claimed under
`SELECT ... FOR UPDATE SKIP LOCKED`), plain Celery none (acks late: at least once).

CPU per completed task, the measured rounds, by process (web: gunicorn, its workers; worker: the
task workers, a Celery pool's processes with its main one), in ms; PostgreSQL's is the whole
server's (exited backends included, other databases' work too):

{chr(10).join(cpu)}
"""


# --- main -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=300, help="tasks per system and round")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="worker processes of each system")
    parser.add_argument("--warmup", type=int, default=32, help="warm-up tasks per system")
    parser.add_argument("--poll-ms", type=float, default=10.0, help="the clients' result polling interval")
    parser.add_argument("--task-timeout", type=float, default=30.0, help="seconds a task may take")
    parser.add_argument(
        "--after-ms", type=float, default=0.0, help="ours with run_after: its delay (0: due at once)"
    )
    parser.add_argument(
        "--db-worker-interval",
        type=float,
        default=0.1,
        help="django-tasks-db's db_worker --interval, s (its default: 1)",
    )
    parser.add_argument(
        "--db-reuse-max",
        type=int,
        default=None,
        help="CELERY_DB_REUSE_MAX for the Celery workers (default: the project's, 1000; 0: Celery "
        "closes a worker's database connections around every task)",
    )
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn workers of each system")
    parser.add_argument("--web-threads", type=int, default=4, help="threads per gunicorn worker")
    parser.add_argument(
        "--grace", type=float, default=2.0, help="seconds to wait after the last round before counting runs"
    )
    parser.add_argument(
        "--no-pause", dest="pause", action="store_false", help="leave the other systems running during a run"
    )
    parser.add_argument("--only", help="comma-separated variants (development); no report")
    parser.add_argument("--no-report", action="store_true", help="do not write bench/REPORT-tasks.md")
    args = parser.parse_args()
    variants = [v for v in VARIANTS if not args.only or v in args.only.split(",")]
    stacks = [s for s in STACKS if any(VARIANTS[v][0] == s for v in variants)]

    begun = harness.setup("tasks", ("gunicorn", "django_tasks", "django_tasks_db"))
    if begun is None:
        return 2
    log_dir = begun.log_dir
    ctx = Context(begun.database.postgres_url, log_dir, f"bench_tasks_{os.getpid()}", STACKS)
    systems: dict[str, System] = {}
    rounds: dict[str, list[Round]] = {v: [] for v in variants}
    warm: dict[str, Round] = {}
    with harness.running(ctx):
        ctx.prepare(functools.partial(migrate, args), STACKS)
        starters = {"ours": start_ours, "dbtasks": start_dbtasks, "celery": start_celery}
        for name in stacks:
            systems[name] = starters[name](ctx, args)
        if "ours" in systems:
            setup_django(ctx, systems["ours"])
        for system in systems.values():
            harness.wait_ready(system)
        print(f"started: {', '.join(systems)}; logs in {log_dir}", flush=True)
        gc.collect()
        gc.freeze()

        def alone(variant: str) -> System:
            """Resume the variant's system, pause the others (unless --no-pause)."""
            return harness.only(systems, VARIANTS[variant][0], args.pause)

        for variant in variants:
            warm[variant] = measure(alone(variant), variant, args.warmup, args)
            print(
                f"  warm-up {variant:10} {warm[variant].rate:7.1f} tasks/s  errors {warm[variant].errors()}",
                flush=True,
            )
        for rnd in range(args.rounds):
            order = variants[rnd % len(variants) :] + variants[: rnd % len(variants)]
            print(f"round {rnd + 1}/{args.rounds}: {', '.join(order)}", flush=True)
            for variant in order:
                measured = measure(alone(variant), variant, args.tasks, args)
                systems[VARIANTS[variant][0]].check_alive()
                rounds[variant].append(measured)
                lat = measured.latencies()
                print(
                    f"  {variant:10} {measured.rate:7.1f} tasks/s  enqueue->done p50 {percentile(lat, 0.5) * 1000:6.1f} "
                    f"ms p99 {percentile(lat, 0.99) * 1000:6.1f} ms  CPU ms/task "
                    + " ".join(
                        f"{c} {1000 * v / max(1, measured.completed):.2f}"
                        for c, v in sorted(measured.cpu.items())
                    )
                    + f" PG {1000 * measured.cpu_postgres / max(1, measured.completed):.2f}"
                    f" client {1000 * measured.cpu_client / max(1, measured.completed):.2f}"
                    f"  errors {measured.errors()}",
                    flush=True,
                )
        for system in systems.values():
            system.resume()
        time.sleep(args.grace)  # a task still running (or run twice) is logged before the logs are read
        for system in systems.values():
            system.check_alive()
        descriptions = {name: system.description for name, system in systems.items()}
        redis = harness.redis_version(systems)

    counts = {name: executions(system.exec_log) for name, system in systems.items()}
    checks = {
        v: exactly_once([r for rnd in [warm[v], *rounds[v]] for r in rnd.runs], counts[VARIANTS[v][0]])
        for v in variants
    }
    if args.only:
        for v in variants:
            print(f"  {v:10} runs: {checks[v]}")
        shutil.rmtree(log_dir, ignore_errors=True)
        return 0
    summary = summarise(rounds, checks)
    info = begun.info(ctx, redis, "django-tasks", "django-tasks-db", "celery", "kombu", "gunicorn")
    text = render(summary, args, info)
    print()
    print(text)
    raw = harness.write_raw("tasks", info=info, args=vars(args), summary=summary)
    if not args.no_report:
        REPORT.write_text(report(text, summary, descriptions, args, info))
        print(f"\nwritten to {REPORT.relative_to(ROOT)} (raw figures: {raw.relative_to(ROOT)})")
    shutil.rmtree(log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
