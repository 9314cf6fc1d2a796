"""What bench/jobs.py and bench/tasks.py share to run systems side by side: a `System` (the
processes of one compared system and its Redis), a run's `Context` (its databases on a PostgreSQL
server, copies of one migrated template, dropped at the end), a keep-alive HTTP/1.1 connection to
a system's web server, and the skeleton of their main(): the checks before a run, one system
measured while the others are paused, the stop of everything started, the versions reported."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

from bench.database import BenchDatabase, conninfo
from bench.http_client import read_response
from bench.processes import Process, cpu_seconds, importable, interrupted, port_open, proc_stat, wait_for
from bench.procstat import CLOCK_TICKS, cpu_model, run_info
from bench.report import load_average
from config.redis_server import RedisServer

BIN = Path(sys.executable).parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/postgres"


# --- processes --------------------------------------------------------------------------------


def postgres_cpu() -> float:
    """CPU seconds of the local PostgreSQL server: its live processes, and (the postmaster's
    cutime/cstime) the backends that exited. Every database's work, not only the bench's."""
    total = 0.0
    postgres = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    fields = proc_stat(entry.name)
                    if fields:
                        postgres[int(entry.name)] = fields
            except OSError:
                continue
    for fields in postgres.values():
        total += int(fields[11]) + int(fields[12])
        if int(fields[1]) not in postgres:  # the postmaster: its reaped children's time too
            total += int(fields[13]) + int(fields[14])
    return total / CLOCK_TICKS


@dataclass
class System:
    """One compared system: its processes (each in a session of its own), its web server's port,
    the execution log its task appends to, its Redis if it has one."""

    name: str
    port: int
    exec_log: Path
    children: list[Process] = field(default_factory=list)
    redis: RedisServer | None = None
    description: str = ""

    def pause(self) -> None:
        for child in self.children:
            child.pause()

    def resume(self) -> None:
        for child in self.children:
            child.resume()

    def cpu(self) -> dict[tuple[str, int], float]:
        """CPU seconds of every process of the system (its sessions' and its Redis), by
        (component, pid): a component is a child's name without the system's, or "redis"."""
        found = {
            (child.name.removeprefix(f"{self.name}-").rstrip("-0123456789"), pid): seconds
            for child in self.children
            for pid, seconds in child.session_cpu().items()
        }
        if self.redis is not None and self.redis.process is not None:
            found["redis", self.redis.process.pid] = cpu_seconds(self.redis.process.pid)
        return found

    def check_alive(self) -> None:
        for child in self.children:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited during the bench:\n{child.log(tail=3000)}")


AnySystem = TypeVar("AnySystem", bound=System)


def start(name: str, command: list[str], env: dict, log_dir: Path, ready_text: str | None = None) -> Process:
    """One of a system's processes, started; wait_ready() waits for them all."""
    return Process(*command, name=name, environ=env, log_dir=log_dir, ready_text=ready_text).start(wait=False)


def celery_command(name: str, workers: int) -> list[str]:
    """The Procfile's worker (prefork, --workers processes), named, without the cluster chatter
    (gossip, mingle, heartbeats) a single worker has no use for: the same for every Celery system."""
    return [
        str(BIN / "celery"),
        *("-A", "config", "worker", "-P", "prefork", "-c", str(workers), "--loglevel", "INFO"),
        *("-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"),
    ]


def wait_ready(system: System) -> None:
    """Every process up (its ready line logged, if it has one), the web server answering; ours'
    router reading its streams."""
    wait_for(
        lambda: all(child.ready() for child in system.children) and port_open(system.port),
        timeout=90,
        interval=0.1,
        message=f"{system.name} to start",
    )
    if system.name == "ours":
        wait_for(
            lambda: router_ready(system),
            timeout=90,
            interval=0.1,
            message="the router to join its consumer group",
        )


def router_ready(system: System) -> bool:
    """Its group has a consumer on every stream of the bench's job type (it has issued XREADGROUP)."""
    import redis

    from eventbus.bus.delivery import streams_for

    assert system.redis is not None
    client = redis.Redis(port=system.redis.port)
    try:
        return all(
            any(group["consumers"] for group in client.xinfo_groups(stream.key))
            for stream in streams_for(None)
        )
    except redis.RedisError:
        return False
    finally:
        client.close()


def only(systems: Mapping[str, AnySystem], name: str, pause: bool) -> AnySystem:
    """Resume this system, pause the others (unless `pause` is off: --no-pause)."""
    if pause:
        for other in systems.values():
            if other.name != name:
                other.pause()
    systems[name].resume()
    time.sleep(0.2)
    return systems[name]


# --- databases --------------------------------------------------------------------------------


class Context:
    """The run's databases (a migrated template and a copy per system, named `<stem>_<name>`),
    log folder, the systems started and the Redis servers (stopped last)."""

    def __init__(self, server_url: str, log_dir: Path, stem: str, names: Iterable[str]):
        self.server_url, self.log_dir, self.stem = server_url, log_dir, stem
        self.template = f"{stem}_template"
        self.databases = {name: f"{stem}_{name}" for name in names}
        self.created: list[str] = []
        self.started: list[System] = []
        self.redis: list[RedisServer] = []
        self.version = ""

    def db_url(self, name: str, scheme: str | None = None) -> str:
        parts = urlsplit(self.server_url)._replace(path="/" + name)
        if scheme:
            parts = parts._replace(scheme=scheme)
        return urlunsplit(parts)

    def execute(self, sql: str, dbname: str = "postgres") -> list:
        import psycopg

        with psycopg.connect(conninfo(self.db_url(dbname)), autocommit=True) as conn:
            cursor = conn.execute(sql)
            return cursor.fetchall() if cursor.description else []

    def create(self, name: str, template: str | None = None) -> None:
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.created.append(name)
        self.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))

    def prepare(self, migrate: Callable[[str], None], copies: Iterable[str]) -> None:
        """The template, created and filled by `migrate` (given its URL), then a copy of it
        (CREATE DATABASE ... TEMPLATE) for each of `copies`."""
        self.create(self.template)
        self.version = "PostgreSQL " + self.execute("SHOW server_version")[0][0]
        migrate(self.db_url(self.template))
        for name in copies:
            self.create(self.databases[name], template=self.template)

    def before_drop(self) -> None:
        """Called once every process has stopped, when the run did not fail, before the databases
        are dropped (their statistics are whole then)."""

    def drop_all(self) -> None:
        for name in reversed(self.created):
            try:
                self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except Exception as exc:
                print(f"could not drop database {name}: {exc}", file=sys.stderr)
        self.created.clear()


# --- the client -------------------------------------------------------------------------------


class KeepAlive:
    """One keep-alive HTTP/1.1 connection to a system's web server."""

    def __init__(self, port: int):
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def send(self, request: bytes, retry: bool) -> tuple[int, dict, bytes]:
        """(status, headers, body) of the request's answer; on a connection the server had closed,
        sent again on a new one when `retry` says it may be."""
        for attempt in (1, 2):
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
            assert self.reader is not None
            self.writer.write(request)
            try:
                status, headers, body = await read_response(self.reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                self.close()
                if attempt == 2 or not retry:
                    raise
                continue
            if headers.get("connection") == "close":
                self.close()
            return status, headers, body
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


# --- main -------------------------------------------------------------------------------------


@dataclass
class Setup:
    """What a run starts from: its database server, the load average and time before it, its log
    folder (kept when the run fails)."""

    bench: str
    database: BenchDatabase
    log_dir: Path
    load_before: str
    started: float

    def info(self, ctx: Context, redis: str, *packages: str) -> dict:
        """The run's facts for its report: the command, machine, load, seconds, versions."""
        info = {
            **run_info(f"bench/{self.bench}.py"),
            "seconds": time.time() - self.started,
            "load_before": self.load_before,
            "load_after": load_average(),
            "database": ctx.version,
            "redis": redis,
            **versions(*packages),
        }
        info["cpu"] = info["cpu"] or cpu_model() or "unknown CPU"
        return info


def setup(bench: str, packages: Iterable[str], why: str = "") -> Setup | None:
    """The checks before a run (the bench's packages installed, a PostgreSQL server), their
    failure printed (then None); else the run's start."""
    missing = [m for m in packages if not importable(m)]
    if missing:
        print(
            f"missing {', '.join(missing)}: run `make bench-{bench}` (installs bench/requirements.txt)",
            file=sys.stderr,
        )
        return None
    database = BenchDatabase(f"bench_{bench}", default_server=DEFAULT_PG)
    if database.vendor != "postgresql":
        print(f"bench/{bench}.py needs PostgreSQL{why}: {database.warning}", file=sys.stderr)
        return None
    started = time.time()
    load_before = load_average()
    return Setup(bench, database, Path(tempfile.mkdtemp(prefix=f"bench-{bench}-")), load_before, started)


@contextlib.contextmanager
def running(ctx: Context) -> Iterator[None]:
    """SIGTERM as Ctrl-C; whatever happens, every process stopped and the databases dropped (the
    logs kept if the run failed)."""
    signal.signal(signal.SIGTERM, interrupted)
    failed = True
    try:
        print(
            f"databases on {ctx.server_url.rsplit('@', 1)[-1]}: migrating a template, copying it",
            flush=True,
        )
        yield
        failed = False
    finally:
        shutdown(ctx)
        try:
            if not failed:
                ctx.before_drop()
        finally:
            ctx.drop_all()
        if failed:
            print(f"logs kept in {ctx.log_dir}", file=sys.stderr)


def shutdown(ctx: Context) -> None:
    """Stop every process started, the Redis servers last, whatever fails on the way."""
    for system in reversed(ctx.started):
        for child in reversed(system.children):
            try:
                child.stop(timeout=20)
            except Exception as exc:
                print(f"stopping {child.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    for server in ctx.redis:
        server.stop()
    try:
        from django.db import connections

        connections.close_all()
    except Exception:
        pass


def redis_version(systems: Mapping[str, System]) -> str:
    for system in systems.values():
        if system.redis is not None:
            return str(system.redis.client().info("server")["redis_version"])
    return "n/a"


def write_raw(bench: str, **figures) -> Path:
    """The run's raw figures, to bench/results/<bench>-<when>.json."""
    RESULTS_DIR.mkdir(exist_ok=True)
    raw = RESULTS_DIR / f"{bench}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    raw.write_text(json.dumps(figures, indent=1, default=str))
    return raw


def versions(*packages: str) -> dict[str, str]:
    """The packages' installed versions, by name with `_` for `-`."""
    from importlib.metadata import version

    return {name.replace("-", "_"): version(name) for name in packages}
