#!/usr/bin/env python
"""Benchmark of the Idempotency-Key layer (the README's Measured table): a script, never a test.

One run, one server. It starts a private Redis, creates a database of its own (on the
PostgreSQL server of DATABASE_URL, or postgres://postgres@127.0.0.1:5432/test when that
answers; else a SQLite file, with a warning: the target is for PostgreSQL), migrates it,
creates a user and a DRF token, starts one gunicorn server (gthread workers; `--server daphne`
for the project's ASGI server) with bench/settings.py, and drives the jobs create
(validate, accept a Job, 201) through keep-alive connections:

    baseline     /bench/baseline/  the same view without any idempotency layer (atomic)
    ours:first   /api/jobs/        our middleware, every request a new key
    ours:replay  /api/jobs/        replays of keys ours completed (CachedStore: from Redis;
                                   --store database: from PostgreSQL)
    drf-idem:*   /bench/drf-idem/  drf-idempotency, first requests and replays
    dik:*        /bench/dik/       django-idempotency-key, first requests and replays
    trivial:*    /bench/trivial/   a view that does nothing, with ours and without a layer
                                   (its ratio is reported, with no target)

Scenarios are warmed up once, then measured in --passes passes (3) of --rounds rounds each (3),
in a rotating order; the table gives the medians over all rounds. A target's ratio is the median
of the passes' ratios, each pass's ratio the median over its rounds of the two scenarios' ratio
within a round. Requests/s counts only the expected answers (201; a replay must
also carry Idempotent-Replayed: true where the layer sends it); anything else is an error.
It prints the targets' checks as PASS/MISS, writes the results section of
bench/REPORT-idempotency.md and the raw figures to bench/results/.

    .venv/bin/python bench/idempotency.py [--duration 4] [--rounds 3] [--passes 3] [--connections 16]

Needs the packages of bench/requirements.txt (gunicorn and the two peers); `make bench`
installs them into the virtualenv first.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import shlex
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.database import BenchDatabase
from bench.http_client import read_response
from bench.processes import Process, child_pids, cpu_seconds, importable, interrupted, wait_port
from bench.procstat import cpu_model
from bench.report import markdown_table, verdict, write_section
from bench.stats import median, median_ratio, percentile
from config.redis_server import free_port
from eventbus.redis.redaction import masked_url

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/test"
REPORT = ROOT / "bench" / "REPORT-idempotency.md"
RESULTS_DIR = ROOT / "bench" / "results"
BEGIN, END = "<!-- bench:results:begin -->", "<!-- bench:results:end -->"
BODY = json.dumps({"domain": "scan", "payload": {"source": "bench", "items": [1, 2, 3]}}).encode()


# --- the server -----------------------------------------------------------------------------


class CpuMeter:
    """CPU seconds used by the server's processes, the bench database's PostgreSQL backends
    and Redis while a scenario runs: what a request costs, whatever else the machine runs."""

    def __init__(self, server: Process, redis_pid: int, db: BenchDatabase):
        self.server, self.redis_pid, self.db = server, redis_pid, db

    def _pids(self) -> dict[str, list[int]]:
        pids = {
            "server": [self.server.pid, *child_pids(self.server.pid)],
            "redis": [self.redis_pid],
        }
        pids["postgres"] = self.db.backend_pids() if self.db.vendor == "postgresql" else []
        return pids

    def snapshot(self) -> dict[tuple[str, int], float]:
        return {(part, pid): cpu_seconds(pid) for part, pids in self._pids().items() for pid in pids}

    def since(self, before: dict) -> dict[str, float]:
        used = {"server": 0.0, "postgres": 0.0, "redis": 0.0}
        for (part, pid), seconds in self.snapshot().items():
            used[part] += seconds - before.get((part, pid), 0.0)
        return used


def server_command(kind: str, port: int, workers: int, threads: int) -> tuple[list[str], str]:
    """The bench's HTTP server (gunicorn's gthread workers, or daphne) and its description."""
    if kind == "gunicorn":
        command = [
            sys.executable,
            "-m",
            "gunicorn",
            "--bind",
            f"127.0.0.1:{port}",
            "--worker-class",
            "gthread",
            "--workers",
            str(workers),
            "--threads",
            str(threads),
            "--keep-alive",
            "75",
            "--backlog",
            "2048",
            "--log-level",
            "warning",
            "django.core.wsgi:get_wsgi_application()",
        ]
        return command, f"gunicorn gthread, {workers} workers x {threads} threads (WSGI)"
    command = [
        sys.executable,
        "-m",
        "daphne",
        "-b",
        "127.0.0.1",
        "-p",
        str(port),
        "-v",
        "0",
        "config.asgi:application",
    ]
    return command, "daphne, 1 process (ASGI, Django's thread per request)"


# --- the load -------------------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    path: str
    layer: str  # whose key pool: "ours", "drf-idem", "dik", "trivial"; "" for the baselines
    replay: bool = False
    replay_header: bool = False  # the layer marks replays with Idempotent-Replayed: true
    label: str = ""


SCENARIOS = [
    Scenario("baseline", "/bench/baseline/", "", label="baseline: no idempotency layer"),
    Scenario("ours:first", "/api/jobs/", "ours", label="ours: first requests"),
    Scenario("ours:replay", "/api/jobs/", "ours", replay=True, replay_header=True, label="ours: replays"),
    Scenario("drf-idem:first", "/bench/drf-idem/", "drf-idem", label="drf-idempotency: first requests"),
    Scenario(
        "drf-idem:replay",
        "/bench/drf-idem/",
        "drf-idem",
        replay=True,
        replay_header=True,
        label="drf-idempotency: replays",
    ),
    Scenario("dik:first", "/bench/dik/", "dik", label="django-idempotency-key: first requests"),
    Scenario("dik:replay", "/bench/dik/", "dik", replay=True, label="django-idempotency-key: replays"),
    Scenario("trivial:baseline", "/bench/trivial-baseline/", "", label="trivial view: no idempotency layer"),
    Scenario("trivial:ours", "/bench/trivial/", "trivial", label="trivial view: ours, first requests"),
]


@dataclass
class Run:
    ok: int = 0
    errors: dict = field(default_factory=dict)
    error_sample: str = ""
    latencies: list = field(default_factory=list)
    elapsed: float = 0.0
    completed_keys: list = field(default_factory=list)
    cpu: dict = field(default_factory=dict)  # CPU seconds by part (server, postgres, redis)

    def cpu_ms(self, part: str | None = None) -> float:
        if not self.ok or not self.cpu:
            return float("nan")
        seconds = sum(self.cpu.values()) if part is None else self.cpu[part]
        return seconds / self.ok * 1000

    @property
    def rps(self) -> float:
        return self.ok / self.elapsed if self.elapsed else 0.0

    def pct(self, q: float) -> float:
        """A latency percentile of the round, ms (bench/stats.py's definition)."""
        return percentile(self.latencies, q) * 1000


class Load:
    def __init__(self, port: int, token: str, connections: int, run_id: str):
        self.port, self.token, self.connections, self.run_id = port, token, connections, run_id
        self.pools: dict[str, list[str]] = {"ours": [], "drf-idem": [], "dik": [], "trivial": []}
        self.counter = 0

    def request(self, path: str, key: str) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Authorization: Token {self.token}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json\r\nIdempotency-Key: {key}\r\nContent-Length: {len(BODY)}\r\n\r\n"
        ).encode() + BODY

    def run(self, scenario: Scenario, duration: float, tag: str) -> Run:
        return asyncio.run(self._run(scenario, duration, tag))

    async def _run(self, scenario: Scenario, duration: float, tag: str) -> Run:
        result = Run()
        pool = self.pools.get(scenario.layer, [])
        if scenario.replay:
            if not pool:
                raise RuntimeError(f"{scenario.name}: no completed key to replay")
            replay_keys = pool[:]
            random.shuffle(replay_keys)
        start = time.perf_counter()
        deadline = start + duration
        next_replay = 0

        def next_key() -> str:
            nonlocal next_replay
            if scenario.replay:
                key = replay_keys[next_replay % len(replay_keys)]
                next_replay += 1
                return key
            self.counter += 1
            return f"{self.run_id}-{tag}-{self.counter}"

        async def connection():
            reader = writer = None
            while time.perf_counter() < deadline:
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                key = next_key()
                sent = time.perf_counter()
                writer.write(self.request(scenario.path, key))
                try:
                    status, headers, body = await read_response(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    writer.close()
                    reader = writer = None
                    result.errors["connection lost"] = result.errors.get("connection lost", 0) + 1
                    continue
                done = time.perf_counter()
                if done > deadline:
                    break
                expected = status == 201 and (
                    not (scenario.replay and scenario.replay_header)
                    or headers.get("idempotent-replayed") == "true"
                )
                if expected:
                    result.ok += 1
                    result.latencies.append(done - sent)
                    if not scenario.replay and scenario.layer:
                        result.completed_keys.append(key)
                else:
                    label = f"HTTP {status}" + (" not marked replayed" if status == 201 else "")
                    result.errors[label] = result.errors.get(label, 0) + 1
                    result.error_sample = result.error_sample or body[:300].decode(errors="replace")
                if headers.get("connection") == "close":
                    writer.close()
                    reader = writer = None
            if writer is not None:
                writer.close()

        await asyncio.gather(*(connection() for _ in range(self.connections)))
        result.elapsed = time.perf_counter() - start
        if scenario.layer and not scenario.replay:
            self.pools[scenario.layer].extend(result.completed_keys)
        return result


# --- the report -----------------------------------------------------------------------------


def machine(db: BenchDatabase, description: str) -> dict:
    from importlib.metadata import version

    import django
    import drf_idempotency

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "database": db.version,
        "server": description,
        "peers": f"drf-idempotency {drf_idempotency.__version__}, "
        f"django-idempotency-key {version('django-idempotency-key')}",
    }


def summarise(runs: dict[str, list[Run]], passes: int = 1) -> dict[str, dict]:
    """Each scenario's medians over its rounds; `passes`: the rounds are that many passes of
    equal length, in order (their requests/s also kept per pass, for the targets' ratios)."""
    summary = {}
    for name, rs in runs.items():
        per_pass = len(rs) // passes
        errors: dict[str, int] = {}
        for r in rs:
            for label, n in r.errors.items():
                errors[label] = errors.get(label, 0) + n
        summary[name] = {
            "rps": median(r.rps for r in rs),
            "rps_rounds": [round(r.rps, 1) for r in rs],
            "rps_passes": [[r.rps for r in rs[i * per_pass : (i + 1) * per_pass]] for i in range(passes)],
            "cpu_rounds": [sum(r.cpu.values()) / r.ok * 1000 if r.ok else float("nan") for r in rs],
            "p50": median(r.pct(0.50) for r in rs),
            "p99": median(r.pct(0.99) for r in rs),
            "requests": sum(r.ok for r in rs),
            "cpu_ms": {part: median(r.cpu_ms(part) for r in rs) for part in ("server", "postgres", "redis")},
            "errors": errors,
            "error_sample": next((r.error_sample for r in rs if r.error_sample), ""),
        }
    return summary


# Why the replays against drf-idempotency are a figure with no target: it answers a replay
# before authenticating the request, where ours authenticates first (by design).
DRF_REPLAY_REASON = (
    "drf-idempotency replays before authenticating; ours authenticates every request first, by design"
)


def checks(s: dict[str, dict]) -> list[tuple[str, float, str, bool | None, list[float]]]:
    """Each ratio is the median of the passes' ratios; a pass's ratio is the median over its
    rounds of the two scenarios' ratio within a round (they ran minutes apart at most), which
    the machine's other load disturbs least. Each row also gives the passes' ratios."""

    def ratio(a, b):
        passes = [median_ratio(x, y) for x, y in zip(s[a]["rps_passes"], s[b]["rps_passes"])]
        return median(passes), passes

    rows = [
        ("first requests >= 85% of baseline (cost <= 15%)", ratio("ours:first", "baseline"), ">= 0.85", 0.85),
        (
            "trivial view: first requests vs baseline (reported)",
            ratio("trivial:ours", "trivial:baseline"),
            "-",
            None,
        ),
        ("replays >= 2x first execution", ratio("ours:replay", "ours:first"), ">= 2.00", 2.0),
        ("first requests >= drf-idempotency", ratio("ours:first", "drf-idem:first"), ">= 1.00", 1.0),
        ("first requests >= django-idempotency-key", ratio("ours:first", "dik:first"), ">= 1.00", 1.0),
        (
            f"replays vs drf-idempotency (reported: {DRF_REPLAY_REASON})",
            ratio("ours:replay", "drf-idem:replay"),
            "-",
            None,
        ),
        ("replays >= django-idempotency-key", ratio("ours:replay", "dik:replay"), ">= 1.00", 1.0),
    ]
    # A row without a bound is reported, not judged (None).
    return [
        (name, value, target, None if bound is None else value >= bound, passes)
        for name, (value, passes), target, bound in rows
    ]


def render(summary, check_rows, meta) -> str:
    base = summary["baseline"]["rps"]
    rows = []
    for sc in SCENARIOS:
        s = summary[sc.name]
        errors = ", ".join(f"{k}: {v}" for k, v in s["errors"].items()) or "0"
        cpu = s["cpu_ms"]
        rows.append(
            (
                sc.label,
                f"{s['rps']:.0f}",
                f"{s['p50']:.1f}",
                f"{s['p99']:.1f}",
                f"{s['rps'] / base:.2f}x",
                f"{cpu['server']:.2f} + {cpu['postgres']:.2f} + {cpu['redis']:.2f} = {sum(cpu.values()):.2f}",
                str(s["requests"]),
                errors,
            )
        )
    out = markdown_table(
        (
            "scenario",
            "requests/s",
            "p50 ms",
            "p99 ms",
            "vs baseline",
            "CPU ms/request: server + PostgreSQL + Redis",
            "requests (all rounds)",
            "errors",
        ),
        "lrrrrlrl",
        rows,
    )
    out += [
        "",
        *markdown_table(
            (
                "target (ratio: median of the passes' ratios)",
                "ratio",
                "passes' ratios (each: median over its rounds of the ratio within a round)",
                "target",
                "result",
            ),
            "lrrrl",
            (
                (name, f"{value:.3f}", " / ".join(f"{p:.3f}" for p in passes), target, verdict(ok))
                for name, value, target, ok, passes in check_rows
            ),
        ),
    ]

    def cpu_ms(name):
        return median(summary[name]["cpu_rounds"])

    out += [
        "",
        f"CPU per request (server + PostgreSQL + Redis, all rounds' median): ours first requests "
        f"{cpu_ms('ours:first'):.2f} ms vs baseline {cpu_ms('baseline'):.2f} ms "
        f"({(cpu_ms('ours:first') / cpu_ms('baseline') - 1) * 100:+.0f}%); ours replays {cpu_ms('ours:replay'):.2f} ms. "
        "CPU ms/request divides the CPU a scenario used by its expected answers (errors' CPU included).",
        "",
        "Requests/s per round (median above): "
        + "; ".join(f"{name} {s['rps_rounds']}" for name, s in summary.items()),
    ]
    return "\n".join(out)


def write_report(results: str, meta: dict) -> None:
    section = "\n".join(
        [
            f"Run of {meta['date']}, command: `{meta['command']}`",
            "",
            f"Machine: {meta['nproc']} CPUs ({meta['cpu']}), Python {meta['python']}, Django {meta['django']}, "
            f"{meta['database']}, Redis {meta['redis']}; server: {meta['server']}; client: {meta['client']}; "
            f"peers: {meta['peers']}. Load average of the machine (1 min): {meta['load']} "
            f"(on {meta['nproc']} CPUs; anything above what this bench uses is other work competing for them).",
            "",
            results,
        ]
    )
    write_section(REPORT, section, BEGIN, END, "# Idempotency benchmark")


# --- main -----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per scenario and round")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per scenario")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per pass")
    parser.add_argument("--passes", type=int, default=3, help="measurement passes; a ratio: their median")
    parser.add_argument("--connections", type=int, default=16, help="keep-alive connections in flight")
    parser.add_argument("--server", choices=("gunicorn", "daphne"), default="gunicorn")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="gunicorn workers")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker")
    parser.add_argument(
        "--pool",
        action="store_true",
        help="Django's psycopg connection pool (DATABASES OPTIONS pool) instead of persistent connections",
    )
    parser.add_argument(
        "--store",
        choices=("cached", "database"),
        default="cached",
        help="our store: the project's CachedStore (replays from Redis) or the DatabaseStore alone",
    )
    parser.add_argument("--only", help="comma-separated scenario names (profiling); no report")
    parser.add_argument("--no-report", action="store_true", help="do not write bench/REPORT-idempotency.md")
    args = parser.parse_args()

    missing = [m for m in ("gunicorn", "drf_idempotency", "idempotency_key") if not importable(m)]
    if missing:
        print(
            f"missing {', '.join(missing)}: run `{sys.executable} -m pip install -r bench/requirements.txt`"
            " (or `make bench`)",
            file=sys.stderr,
        )
        return 2

    from config.redis_server import RedisServer

    db = BenchDatabase(f"bench_idem_{os.getpid()}", default_server=DEFAULT_PG)
    if db.warning:
        print(f"WARNING: {db.warning}. The targets are for PostgreSQL.", file=sys.stderr)
    redis_server = server = None
    tmp = tempfile.TemporaryDirectory(prefix="bench-idem-")
    previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM,)}
    try:
        db.create()
        redis_server = RedisServer().start()
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "DATABASE_URL": db.url,
            "REDIS_URL": redis_server.url,
            "PYTHONPATH": str(ROOT),
            "BENCH_SERVER": args.server,
        }
        if args.pool:
            env["BENCH_POOL"] = "1"
        if args.store == "database":
            env["BENCH_STORE"] = "idempotency.stores.db.DatabaseStore"
        if args.server == "daphne" or args.workers == 1:
            env["BENCH_ONE_PROCESS"] = "1"  # django-idempotency-key's in-process lock suffices
        os.environ.update({k: env[k] for k in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL")})
        token = _prepare_django()
        port = free_port()
        command, description = server_command(args.server, port, args.workers, args.threads)
        server = Process(*command, name="server", environ=env, log_dir=Path(tmp.name))
        description += ", psycopg connection pool" if args.pool else ", persistent connections (CONN_MAX_AGE)"
        if args.store == "database":
            description += "; ours with the DatabaseStore alone (no replay cache)"
        print(
            f"database {db.version} ({db.name}), redis {masked_url(redis_server.url)}, {description} on :{port}"
        )
        server.start()
        wait_port(server, port, timeout=30, what="the server")
        assert redis_server.process is not None
        meter = CpuMeter(server, redis_server.process.pid, db)

        scenarios = [s for s in SCENARIOS if not args.only or s.name in args.only.split(",")]
        load = Load(port, token, args.connections, uuid.uuid4().hex[:8])
        load_before = os.getloadavg()
        print(f"warm-up: {args.warmup:g} s per scenario")
        for sc in scenarios:
            run = _measure(load, sc, args.warmup, "w", meter)
            if run.errors:
                print(f"  {sc.name}: {run.errors}; sample: {run.error_sample!r}")
        runs: dict[str, list[Run]] = {sc.name: [] for sc in scenarios}
        total = args.passes * args.rounds
        for rnd in range(total):
            shift = rnd * 2 % len(scenarios)
            order = scenarios[shift:] + scenarios[:shift]
            print(
                f"pass {rnd // args.rounds + 1}/{args.passes}, round {rnd % args.rounds + 1}/{args.rounds}: "
                + ", ".join(sc.name for sc in order)
            )
            for sc in order:
                run = _measure(load, sc, args.duration, f"r{rnd}", meter)
                runs[sc.name].append(run)
                print(
                    f"  {sc.name:16} {run.rps:8.1f} req/s  p50 {run.pct(0.5):6.1f} ms  "
                    f"p99 {run.pct(0.99):6.1f} ms  CPU/req {run.cpu_ms():5.2f} ms  "
                    f"errors {sum(run.errors.values())}"
                )

        summary = summarise(runs, args.passes)
        for name, s in summary.items():
            if s["errors"]:
                print(f"{name}: errors {s['errors']}; sample: {s['error_sample']!r}")
        if args.only:
            return 0
        check_rows = checks(summary)
        meta = {
            **machine(db, description),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": shlex.join([_python(), "bench/idempotency.py", *sys.argv[1:]]),
            "load": f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after",
            "redis": _redis_version(redis_server.url),
            "client": f"asyncio, {args.connections} keep-alive connections, {args.passes} passes of "
            f"{args.rounds} rounds x {args.duration:g} s per scenario (rotating order) after "
            f"{args.warmup:g} s warm-up",
        }
        results = render(summary, check_rows, meta)
        print()
        print(results)
        print()
        for name, value, target, ok, passes in check_rows:
            each = " / ".join(f"{p:.3f}" for p in passes)
            print(f"{verdict(ok)}  {name}: {value:.3f}, the median of the passes' {each} (target {target})")
        print(f"load average {meta['load']} (1 min), nproc {os.cpu_count()}")
        RESULTS_DIR.mkdir(exist_ok=True)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        (RESULTS_DIR / f"idempotency-{stamp}.json").write_text(
            json.dumps({"meta": meta, "summary": summary, "checks": check_rows}, indent=2)
        )
        if not args.no_report:
            write_report(results, meta)
            print(f"\nwritten: {REPORT.relative_to(ROOT)}")
        return 0
    finally:
        if server:
            server.stop()
        try:
            from django.db import connections

            connections.close_all()
        except Exception:
            pass
        if redis_server:
            redis_server.stop()
        db.drop()
        tmp.cleanup()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _measure(load: Load, sc: Scenario, duration: float, tag: str, meter: CpuMeter) -> Run:
    from eventbus.models import Job

    before = Job.objects.count() if sc.replay else 0
    cpu_before = meter.snapshot()
    run = load.run(sc, duration, tag)
    run.cpu = meter.since(cpu_before)
    if sc.replay:
        executed = Job.objects.count() - before
        if executed:
            run.errors["view executed on replay"] = executed
    return run


def _prepare_django() -> str:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    user = get_user_model().objects.create_user("bench", password=uuid.uuid4().hex)
    return Token.objects.create(user=user).key


def _redis_version(url: str) -> str:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return client.info("server")["redis_version"]
    finally:
        client.close()


def _python() -> str:
    try:
        return (
            os.path.relpath(sys.executable, ROOT) if Path(sys.executable).is_relative_to(ROOT) else "python"
        )
    except ValueError:
        return "python"


if __name__ == "__main__":
    sys.exit(main())
