#!/usr/bin/env python
"""Redis Cluster benchmark (the README's Measured table, docs/howto/cluster.md; issue "Scale out on Redis Cluster"): a script, never a
test.

One run starts two private Redis Clusters side by side (config.redis_server.RedisClusterServers):
1 master, and 3 masters whose shard tags eventbus.redis.placement.balance() spreads when it exists. The
bus (bench/cluster_settings.py: EVENTBUS["CLUSTER"], domains scan and chat of --shards shards
each) runs three topologies on them, in this order, each on flushed masters:

- "1 master":  1 router (`manage.py run_router`) for every shard;
- "3 masters": 3 routers, each given the shards its master owns (`--domains scan:0,chat:3,...`);
- "3 masters, PUBLISH": the same, the routers publishing by classic PUBLISH, the old behaviour
  (this script as a wrapper: eventbus.bus.delivery.publish_command patched to "PUBLISH", then
  call_command("run_router")), which a cluster copies to every node.

and measures on each, with every Redis node's CPU time from /proc (each thread's run time in ns,
/proc/PID/task/*/schedstat; /proc/PID/stat's 10 ms ticks where that is missing):

1. publish, from this process, each job's seqs in order (half the jobs scan, half chat):
   a. depth 1: --single-events events, one eventbus.publish_event call each (the workers' path:
      a job publishes one event per stage), over as many jobs as give each job the events per
      job of b.;
   b. batched: --events events over --jobs jobs by eventbus.publish_events in calls of --batch;
   the masters are flushed before each; the targets are judged on a.; a. runs --repeats times
   (3) on 1 and on 3 masters, interleaved, and the round whose ratio of Redis CPU per event
   (3 masters over 1) is the median is the one judged and shown;
2. route: the real routers in --burst mode drain the backlog of 1b (subprocesses); the rate is
   the events over the time from the first router's start to the last one's stop (their logs);
3. publish -> frame latency (SPUBLISH topologies): the routers running (not --burst), one
   daphne (the gateway: its hub SSUBSCRIBEs on each master) with --sockets WebSockets on as
   many scan jobs, a publisher process (bench/gateway.py's) calling publish_event at --rate
   events/s for --duration s; a tap (this process's SSUBSCRIBE on each master) times the
   router's SPUBLISH too. With --latency-via ssubscribe, or when the gateway cannot start,
   the tap alone (publish -> SSUBSCRIBE message), and the report says so.

Printed, and written to bench/REPORT-cluster.md (the section between its markers): the rates,
each master's shards, CPU seconds per phase and share of the cluster's Redis CPU, Redis CPU per
event, the script calls and COMMAND GETKEYS lookups each master answered, one PASS/MISS line per
target, and what N masters would carry.

    .venv/bin/python bench/cluster.py [--events 60000] [--jobs 3000] [--single-events 20000]
        [--shards 6] [--batch 50] [--repeats 3] [--rate 1000] [--duration 10] [--sockets 200]
        [--latency-via gateway|ssubscribe]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway import Target, close_sockets, create_fixtures, open_sockets, record_frames
from bench.processes import Process, cpu_seconds, wait_port
from bench.procstat import run_info
from bench.report import load_average, verdict, write_section
from bench.stats import percentiles
from config.redis_server import RedisClusterServers, RedisServer, free_port

REPORT = ROOT / "bench" / "REPORT-cluster.md"
SETTINGS = "bench.cluster_settings"
DOMAINS = ("scan", "chat")
STAGE = "bench"
DATA = {"progress": 0.5, "note": "benchmark event"}
SHARE_TOLERANCE = 0.15  # each master's share of the cluster's Redis CPU: a third, +-15 %
CPU_RATIO_TARGET = 1.1  # 3 masters' Redis CPU per event against 1 master's
LATENCY_P99_MS = 10.0  # the README's target at 1,000 events/s with 200 sockets (informative here)
ROUTER_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*router (\S+): (group|stopped)")


# --- the classic PUBLISH routers run through this script -----------------------------------------


def wrapped_router(argv: list[str]) -> None:
    """`bench/cluster.py --wrapped-router --classic run_router ARGS`: `manage.py run_router ARGS`
    with route.lua publishing by PUBLISH (the old behaviour)."""
    flags, args = argv[: argv.index("run_router")], argv[argv.index("run_router") + 1 :]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    import django

    django.setup()
    from django.core.management import call_command

    import eventbus.bus.delivery

    if "--classic" in flags:
        assert hasattr(eventbus.bus.delivery, "publish_command"), (
            "eventbus.bus.delivery.publish_command is gone"
        )
        eventbus.bus.delivery.publish_command = lambda: "PUBLISH"
    call_command("run_router", *args)


# --- machine, processes -----------------------------------------------------------------------


def load_line() -> str:
    return f"load average {load_average()}, nproc {os.cpu_count()}"


# Each thread's run time in ns; /proc/PID/stat's 10 ms ticks (cpu_seconds) on a kernel without it.
SCHEDSTAT = Path("/proc/self/schedstat").exists()


def run_seconds(pid: int) -> float:
    """CPU seconds of a process, every thread's, to the ns (/proc/PID/task/*/schedstat): a
    publish at depth 1 costs a master a few tenths of a second, which 10 ms ticks would blur."""
    if not SCHEDSTAT:
        return cpu_seconds(pid)
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except OSError:  # a thread that ended meanwhile
            pass
    return total / 1e9


def run_routers(routers: list[Process], timeout: float) -> tuple[list[float], list[float]]:
    """Start the routers (--burst) and wait for them all to exit. Each one's CPU seconds after its
    start line (what routing took), and before it (Django's start-up and the checks): /proc is
    read when the line appears in its log, and the total comes from wait4's rusage."""
    for router in routers:
        router.start()
    deadline = time.monotonic() + timeout
    total: dict[int, float] = {}
    at_start: dict[int, float] = {}
    while len(total) < len(routers):
        for i, router in enumerate(routers):
            if i in total:
                continue
            if i not in at_start and " streams " in router.log(tail=4000):
                at_start[i] = cpu_seconds(router.pid)
            pid, status, usage = os.wait4(router.pid, os.WNOHANG)
            if pid:
                router.process.returncode = os.waitstatus_to_exitcode(status)  # type: ignore[union-attr]
                total[i] = usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            for router in routers:
                router.stop(timeout=20)
            raise RuntimeError(f"the routers did not finish in {timeout:.0f} s:\n{routers[0].log(tail=3000)}")
        time.sleep(0.01)
    startup = [at_start.get(i, 0.0) for i in range(len(routers))]
    return [total[i] - startup[i] for i in range(len(routers))], startup


def router_window(children: list[Process]) -> float | None:
    """Seconds from the first router's start to the last one's stop, by their log lines."""
    starts: list[datetime.datetime] = []
    stops: list[datetime.datetime] = []
    for child in children:
        for line in child.log().splitlines():
            match = ROUTER_LOG_TIME.match(line)
            if match:
                when = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
                (starts if match.group(3) == "group" else stops).append(when)
    if len(starts) != len(children) or len(stops) != len(children):
        return None
    return (max(stops) - min(starts)).total_seconds()


# --- the clusters -----------------------------------------------------------------------------


class Cluster:
    """A private Redis Cluster, its masters by name ("127.0.0.1:port") with their pids."""

    def __init__(self, masters: int):
        self.servers = RedisClusterServers(masters).start()
        import redis

        self.nodes = {f"127.0.0.1:{n.port}": n for n in self.servers.nodes}
        self.direct = {name: redis.Redis(port=n.port) for name, n in self.nodes.items()}
        self.placement = "one master holds every slot" if masters == 1 else ""

    @property
    def url(self) -> str:
        return self.servers.url

    def pids(self) -> dict[str, int]:
        return {name: n.process.pid for name, n in self.nodes.items()}  # type: ignore[union-attr]

    def cpu(self) -> dict[str, float]:
        return {name: run_seconds(pid) for name, pid in self.pids().items()}

    def client(self):
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(self.url)

    def flush(self) -> None:
        for client in self.direct.values():
            client.flushall()
            client.config_resetstat()

    def reset_stats(self) -> None:
        for client in self.direct.values():
            client.config_resetstat()

    def command_calls(self) -> dict[str, dict[str, int]]:
        """Calls per node since the last reset_stats (INFO commandstats) of the commands that tell
        the story: the scripts, their publish command, and redis-py's key lookups."""
        found = {}
        for name, client in self.direct.items():
            stats = client.info("commandstats")
            found[name] = {
                command: stats.get(f"cmdstat_{command}", {}).get("calls", 0)
                for command in ("evalsha", "spublish", "publish", "command|getkeys")
            }
        return found

    def all_calls(self) -> dict[str, int]:
        """Calls of every command since the last reset_stats, summed over the masters (INFO
        commandstats): what a phase sent besides its scripts, if anything."""
        found: collections.Counter = collections.Counter()
        for client in self.direct.values():
            for name, stats in client.info("commandstats").items():
                found[name.removeprefix("cmdstat_")] += stats.get("calls", 0)
        return dict(found)

    def load_scripts(self) -> None:
        """Every script of the bus on every master, as on a bus that has been running: otherwise the
        first batch of the first phase to call one would run twice (NOSCRIPT, load, again)."""
        from eventbus.bus import scripts

        for script in vars(scripts).values():
            if isinstance(script, scripts.LuaScript):
                for client in self.direct.values():
                    client.script_load(script.source)

    def balance(self) -> str:
        """eventbus.redis.placement.balance (being written elsewhere), when it exists."""
        try:
            from eventbus.redis import placement
        except ImportError:
            self.placement = "not balanced (eventbus.redis.placement missing)"
            return self.placement
        client = self.client()
        try:
            moves = placement.balance(client)
            self.placement = f"balanced by eventbus.redis.placement.balance ({len(moves)} move(s))"
        except Exception as exc:  # reported, the bench goes on with the layout it has
            self.placement = (
                f"not balanced (eventbus.redis.placement.balance failed: {type(exc).__name__}: {exc})"
            )
        finally:
            client.close()
        return self.placement

    def shards(self) -> dict[str, list[str]]:
        """The shards ("domain:shard") each master owns now."""
        from eventbus.bus.keys import tag
        from eventbus.jobtypes import shard_count

        client = self.client()
        try:
            owned: dict[str, list[str]] = {name: [] for name in self.nodes}
            for domain in DOMAINS:
                for shard in range(shard_count(domain)):
                    owned[client.get_node_from_key(tag(domain, shard)).name].append(f"{domain}:{shard}")
            return owned
        finally:
            client.close()

    def stop(self) -> None:
        for client in self.direct.values():
            client.close()
        self.servers.stop()


class Topology:
    def __init__(self, name: str, cluster: Cluster, command: str):
        self.name, self.cluster, self.command = name, cluster, command
        self.shards = cluster.shards()

    @property
    def masters(self) -> int:
        return len(self.cluster.nodes)

    def router_domains(self) -> list[list[str] | None]:
        """One router for 1 master (every shard); else one per master, given its shards."""
        if self.masters == 1:
            return [None]
        return [owned for owned in self.shards.values() if owned]

    def router_command(
        self, consumer: str, domains: list[str] | None, burst: bool, block_ms: int | None = None
    ) -> list[str]:
        if self.command == "PUBLISH":
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--wrapped-router",
                "--classic",
                "run_router",
            ]
        else:
            command = [sys.executable, "manage.py", "run_router"]
        command += ["--consumer", consumer] + (["--burst"] if burst else [])
        command += ["--block-ms", str(block_ms)] if block_ms is not None else []
        return command + (["--domains", ",".join(domains)] if domains else [])


# --- the workload -----------------------------------------------------------------------------


def single_jobs(args) -> int:
    """Jobs of the depth-1 publish: each gets the events per job of the batched one."""
    return max(1, round(args.single_events * args.jobs / args.events))


def workload(events: int, jobs: int, prefix: str = "job") -> list[tuple]:
    """`events` events round robin over `jobs` jobs (even jobs scan, odd chat), seqs from 1."""
    return [
        (DOMAINS[(i % jobs) % 2], f"{prefix}-{i % jobs}", STAGE, i // jobs + 1, DATA) for i in range(events)
    ]


def owners(topology: Topology):
    """The master that carries an event: the one owning its job's shard."""
    from eventbus.bus.keys import JobKeys

    owner = {shard: name for name, owned in topology.shards.items() for shard in owned}
    shard_of: dict[tuple[str, str], str] = {}

    def of(event: tuple) -> str:
        key = (event[0], event[1])
        if key not in shard_of:
            shard_of[key] = owner[f"{key[0]}:{JobKeys(*key).shard}"]
        return shard_of[key]

    return of


def carried(topology: Topology, batch: list[tuple]) -> dict[str, int]:
    """Events per master: those of the shards it owns."""
    counts = collections.Counter(map(owners(topology), batch))
    return {name: counts[name] for name in topology.cluster.nodes}


def phase_cpu(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in before}


# --- 1. publish ---------------------------------------------------------------------------------


def publish_phase(
    topology: Topology, events: list[tuple], depth: int, warmup: int, others: list[Cluster]
) -> dict:
    """`events` published on flushed masters: one publish_event call each (depth 1) or
    publish_events calls of `depth` events. The first `warmup` events (published the same way)
    open the connections to every master and are not counted."""
    from eventbus import publish_event, publish_events

    topology.cluster.flush()
    warm, measured = events[:warmup], events[warmup:]
    chunks = [measured[i : i + depth] for i in range(0, len(measured), depth)]
    owner = owners(topology)
    # A call of publish_events reaches each master it has events for as one write.
    writes = sum(len({owner(event) for event in chunk}) for chunk in chunks)
    if depth == 1:
        for event in warm:
            publish_event(*event)
    else:
        for i in range(0, len(warm), depth):
            publish_events(warm[i : i + depth])
    topology.cluster.reset_stats()
    idle_before = [c.cpu() for c in others]
    before, own_before = topology.cluster.cpu(), time.process_time()
    began = time.perf_counter()
    published = 0
    if depth == 1:
        for event in measured:
            published += publish_event(*event)
    else:
        for chunk in chunks:
            published += sum(publish_events(chunk))
    elapsed = time.perf_counter() - began
    own = time.process_time() - own_before
    cpu = phase_cpu(before, topology.cluster.cpu())
    if published != len(measured):
        raise RuntimeError(
            f"{topology.name}: published {published} of {len(measured)} events (depth {depth})"
        )
    return {
        "depth": depth,
        "events": len(measured),
        "calls": len(chunks),
        "writes": writes,
        "seconds": elapsed,
        "rate": len(measured) / elapsed,
        "cpu": cpu,
        "carried": carried(topology, measured),
        "client_cpu": own,
        "idle": idle_rates(others, idle_before, elapsed),
        "commands": topology.cluster.command_calls(),
        "all_commands": topology.cluster.all_calls(),
    }


def cpu_ratio(three: dict, one: dict) -> float:
    """The Redis CPU per event of a phase on 3 masters over that on 1 master."""
    return (sum(three["cpu"].values()) / three["events"]) / (sum(one["cpu"].values()) / one["events"])


def idle_rates(others: list[Cluster], before: list[dict[str, float]], seconds: float) -> list[float]:
    """CPU seconds per second of each node of the clusters left idle meanwhile."""
    return [
        (after - start) / seconds
        for cluster, was in zip(others, before)
        for start, after in zip(was.values(), cluster.cpu().values())
    ]


# --- 2. route -----------------------------------------------------------------------------------


def route_phase(topology: Topology, batch: list[tuple], env: dict, log_dir: Path, timeout: float) -> dict:
    """The backlog the publish phase left, drained by real routers in --burst mode."""
    from eventbus.bus.delivery import streams_for
    from eventbus.bus.keys import JobKeys

    cluster = topology.cluster
    cluster.reset_stats()
    routers = [
        Process(
            *topology.router_command(f"bench-r{i}", domains, burst=True),
            name=f"{topology.name.replace(' ', '-').replace(',', '')}-router-{i}",
            environ=env,
            log_dir=log_dir,
        )
        for i, domains in enumerate(topology.router_domains())
    ]
    before = cluster.cpu()
    began = time.perf_counter()
    router_cpu, startup_cpu = run_routers(routers, timeout)
    wall = time.perf_counter() - began
    cpu = phase_cpu(before, cluster.cpu())
    commands = cluster.command_calls()
    for router in routers:
        if router.process and router.process.returncode:
            raise RuntimeError(f"{router.name} exited {router.process.returncode}:\n{router.log(tail=3000)}")
    window = router_window(routers)

    # Every event applied, once: each job's applied seq is its last seq, nothing pending or unread.
    client = cluster.client()
    try:
        last: dict[tuple[str, str], int] = {}
        for domain, job, _, seq, _ in batch:
            last[(domain, job)] = max(seq, last.get((domain, job), 0))
        pipe = client.pipeline(transaction=False)
        for domain, job in last:
            pipe.get(JobKeys(domain, job).applied)
        applied = [int(value or 0) for value in pipe.execute()]
        wrong = sum(a != seq for a, seq in zip(applied, last.values()))
        pending = lag = 0
        for stream in streams_for(DOMAINS):  # the workload's (the project registers more domains)
            for group in client.xinfo_groups(stream.key):
                pending += group["pending"]
                lag += group.get("lag") or 0
    finally:
        client.close()
    if wrong or pending or lag:
        raise RuntimeError(f"{topology.name}: {wrong} jobs not fully applied, {pending} pending, lag {lag}")
    cluster.flush()  # idle and empty while the other topologies run
    return {
        "events": len(batch),
        "routers": len(routers),
        "window": window,
        "wall": wall,
        "rate": len(batch) / (window or wall),
        "cpu": cpu,
        "carried": carried(topology, batch),
        "router_cpu": router_cpu,
        "router_startup_cpu": startup_cpu,
        "commands": commands,
    }


# --- 3. publish -> frame latency ----------------------------------------------------------------


def bench_env(cluster_url: str, plain_url: str, database_url: str, shards: int, maxlen: int) -> dict:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE=SETTINGS,
        REDIS_URL=cluster_url,
        EVENTBUS_CLUSTER="1",
        CELERY_BROKER_URL=plain_url,
        CACHE_URL=plain_url,
        DATABASE_URL=database_url,
        BENCH_CLUSTER_SHARDS=str(shards),
        BENCH_STREAM_MAXLEN=str(maxlen),
        LOG_LEVEL="INFO",  # the routers' start and stop lines time the route phase
        PYTHONUNBUFFERED="1",
    )
    return env


def shard_channels(cluster: Cluster) -> int:
    return sum(
        len(c.execute_command("PUBSUB", "SHARDCHANNELS", "*:channel:*")) for c in cluster.direct.values()
    )


async def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def routers_ready(cluster: Cluster, routers: list[Process]) -> bool:
    """Every router alive, and every shard stream's group has a consumer."""
    from eventbus.bus.delivery import streams_for

    for router in routers:
        if not router.alive():
            raise RuntimeError(f"{router.name} exited:\n{router.log(tail=3000)}")
    client = cluster.client()
    try:
        return all(any(g["consumers"] for g in client.xinfo_groups(s.key)) for s in streams_for(None))
    except Exception:
        return False
    finally:
        client.close()


class Tap:
    """This process's SSUBSCRIBE on each master to the channels it owns: times each SPUBLISH."""

    def __init__(self, cluster: Cluster, channels: list[str]):
        self.cluster, self.channels = cluster, channels
        self.received: list[tuple[int, bytes]] = []
        self.pubsubs: list = []
        self.tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        import redis.asyncio as aioredis

        client = self.cluster.client()
        try:
            # One SSUBSCRIBE per slot (the channels of one command must share theirs).
            by_node: dict[str, dict[int, list[str]]] = collections.defaultdict(
                lambda: collections.defaultdict(list)
            )
            for channel in self.channels:
                node = client.get_node_from_key(channel).name
                by_node[node][client.keyslot(channel)].append(channel)
        finally:
            client.close()
        for name, slots in by_node.items():
            node = aioredis.Redis(port=self.cluster.nodes[name].port)
            pubsub = node.pubsub(ignore_subscribe_messages=True)
            for channels in slots.values():
                await pubsub.ssubscribe(*channels)
            self.pubsubs.append((node, pubsub))
            self.tasks.append(asyncio.create_task(self._read(pubsub)))

    async def _read(self, pubsub) -> None:
        while True:
            message = await pubsub.get_message(timeout=1.0)
            if message and message["type"] == "smessage":
                self.received.append((time.time_ns(), message["data"]))

    def error(self) -> str | None:
        """Why a reader stopped, if one did."""
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception():
                return repr(task.exception())
        return None

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for node, pubsub in self.pubsubs:
            await pubsub.aclose()
            await node.aclose()


def latency_ms(received: list[tuple[int, bytes]], warmup: int) -> tuple[list[float], dict[str, list[int]]]:
    """Receive - publish times of events past the warm-up (ms, sorted), and the seqs per job."""
    times: list[float] = []
    seqs: dict[str, list[int]] = collections.defaultdict(list)
    for at, raw in received:
        event = json.loads(raw)
        if event.get("type", "event") != "event":
            continue
        seqs[event["job_id"]].append(event["seq"])
        if event["data"]["i"] >= warmup:
            times.append((at - event["data"]["t"]) / 1e6)
    return sorted(times), seqs


def quantiles(ordered: list[float]) -> dict[str, float]:
    return percentiles(ordered, "p50", "p90", "p99", "max", digits=2)


def check_once(seqs: dict[str, list[int]], expected: dict[str, int]) -> tuple[int, int]:
    """(duplicates, missing) against each job's expected seqs 1..n."""
    duplicates = missing = 0
    for job, n in expected.items():
        got = seqs.get(job, [])
        duplicates += len(got) - len(set(got))
        missing += len(set(range(1, n + 1)) - set(got))
    return duplicates, missing


async def latency_phase(topology: Topology, ctx: dict, args, jobs: list[str]) -> dict:
    from eventbus.bus.keys import JobKeys

    cluster, env, log_dir = topology.cluster, ctx["env"][topology.cluster.url], ctx["log_dir"]
    cluster.flush()
    label = topology.name.replace(" ", "-")
    routers = [
        Process(
            *topology.router_command(f"bench-l{i}", domains, False, args.router_block_ms),
            name=f"{label}-latency-router-{i}",
            environ=env,
            log_dir=log_dir,
        )
        for i, domains in enumerate(topology.router_domains())
    ]
    daphne = None
    sockets: list = []
    readers: list[asyncio.Task] = []
    frames: list[list] = []
    tap = None
    result: dict = {"via": args.latency_via, "gateway_error": None}
    try:
        for router in routers:
            router.start()
        await wait_for(lambda: routers_ready(cluster, routers), 60, "the routers")
        if args.latency_via == "gateway":
            try:
                port = free_port()
                daphne = Process(
                    str(Path(sys.executable).parent / "daphne"),
                    *("-b", "127.0.0.1", "-p", str(port), "config.asgi:application"),
                    name=f"{label}-daphne",
                    environ=env,
                    log_dir=log_dir,
                ).start()
                await asyncio.get_running_loop().run_in_executor(None, wait_port, daphne, port)
                sockets, _, failures = await open_sockets(
                    Target(port, ctx["session_key"]), jobs, len(jobs), 50
                )
                if failures or len(sockets) != len(jobs):
                    raise RuntimeError(f"{len(sockets)} of {len(jobs)} sockets opened: {dict(failures)}")
                await wait_for(lambda: shard_channels(cluster) >= len(jobs), 60, "the hub's SSUBSCRIBEs")
            except Exception as exc:  # the tap alone, said plainly in the report
                result["gateway_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                result["via"] = "ssubscribe"
                print(f"  the gateway failed ({result['gateway_error']}): tap alone", flush=True)
                await close_sockets(sockets)
                sockets = []
                if daphne:
                    daphne.stop(timeout=20)
        frames = [[] for _ in sockets]
        readers = [asyncio.create_task(record_frames(ws, sink)) for ws, sink in zip(sockets, frames)]
        tap = Tap(cluster, [JobKeys("scan", job).channel for job in jobs])
        await tap.start()

        jobs_file = log_dir / f"{label}-jobs.json"
        jobs_file.write_text(json.dumps(jobs))
        publisher = Process(
            *(sys.executable, str(ROOT / "bench" / "gateway.py"), "--publisher", str(jobs_file)),
            *("--rate", str(args.rate), "--duration", str(args.duration)),
            name=f"{label}-publisher",
            environ=env,
            log_dir=log_dir,
            pipe=True,
        ).start()
        ctx["publishers"].append(publisher)
        loop = asyncio.get_running_loop()
        ready = await loop.run_in_executor(None, publisher.stdout.readline)
        if ready.strip() != "ready":
            raise RuntimeError(f"the publisher did not start: {ready!r}")
        pids = {"redis": list(cluster.pids().values()), "routers": [r.pid for r in routers]}
        if daphne and daphne.alive():
            pids["daphne"] = [daphne.pid]
        cpu_before = {name: sum(map(cpu_seconds, group)) for name, group in pids.items()}
        began = time.perf_counter()
        output = await loop.run_in_executor(None, publisher.stdout.read)
        publisher.wait(timeout=30)
        stats = json.loads(output.strip().splitlines()[-1])

        per_job = collections.Counter(jobs[i % len(jobs)] for i in range(stats["published"]))
        expected_frames = sum(per_job.values())

        def arrived() -> int:
            return len(tap.received) if tap else 0

        last, still = -1, time.perf_counter()
        while True:
            got = arrived() + sum(len(f) for f in frames)
            if got >= expected_frames * (2 if sockets else 1) or time.perf_counter() - still > args.drain:
                break
            if got != last:
                last, still = got, time.perf_counter()
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - began
        cpu = {name: sum(map(cpu_seconds, group)) - cpu_before[name] for name, group in pids.items()}
        warmup = int(args.rate * args.warmup)
        tap_ms, tap_seqs = latency_ms(tap.received, warmup)
        result.update(
            published=stats["published"],
            publisher_rate=stats["rate"],
            publisher_lag_p99_ms=stats["lag_ms"]["p99"],
            tap=quantiles(tap_ms),
            tap_received=len(tap.received),
            tap_check=check_once(tap_seqs, per_job),
            tap_error=tap.error(),
            cpu_percent={name: round(100 * seconds / elapsed, 1) for name, seconds in cpu.items()},
        )
        if sockets:
            received = [item for sink in frames for item in sink]
            frame_ms, frame_seqs = latency_ms(received, warmup)
            result.update(
                sockets=len(sockets),
                frames=quantiles(frame_ms),
                frames_received=len(received),
                frames_check=check_once(frame_seqs, per_job),
                expected=expected_frames,
            )
            daphne_log = daphne.log() if daphne else ""
            result["daphne_errors"] = sum("Traceback" in line for line in daphne_log.splitlines())
        else:
            result["expected"] = expected_frames
    finally:
        for task in readers:
            task.cancel()
        await close_sockets(sockets)
        if tap:
            await tap.close()
        if daphne:
            daphne.stop(timeout=20)
        for router in routers:
            router.stop(timeout=20)
    return result


# --- the report ---------------------------------------------------------------------------------


def commands_per_event(phase: dict) -> str:
    """The commands a phase's masters ran, per event published."""
    calls = {
        name: n
        for name, n in sorted(phase["all_commands"].items())
        if name not in ("info", "config|resetstat") and n
    }
    return ", ".join(f"{name} {n / phase['events']:.3f}" for name, n in calls.items()) or "none"


def share_range() -> tuple[float, float]:
    return (1 - SHARE_TOLERANCE) / 3, (1 + SHARE_TOLERANCE) / 3


def us(seconds: float, events: int) -> float:
    return seconds / events * 1e6 if events else float("nan")


def render(results: dict, args, info: dict) -> tuple[str, list[str]]:
    topologies = results["topologies"]
    one, three, classic = topologies
    low, high = share_range()
    batched = f"batches of {args.batch}"
    rounds = results["single_ratios"]
    out = [
        f"Command: `{info['command']}`",
        "",
        f"{info['when']}; {info['seconds']:.0f} s; this machine: {info['nproc']} CPUs ({info['cpu']}); "
        f"{info['load_start']} at the start, {info['load_end']} at the end; Redis {info['redis']} "
        f"(no AOF: RedisClusterServers' nodes), Python {info['python']}, redis-py {info['redis_py']}, "
        f"Django {info['django']}.",
        "",
        "Workload: published from one process on flushed masters (every script loaded on every master "
        f"beforehand; the first {args.batch} events of each publish, which open the connections, not "
        "counted), each job's seqs in order, half the jobs scan and half chat, domains scan and chat of "
        f"{args.shards} shards each:",
        "",
        f"- depth 1: {args.single_events:,} events over {single_jobs(args):,} jobs, one `publish_event` call "
        "each: the workers' path (a job publishes one event per stage), on which the targets are judged;",
        f"- {batched}: {args.events:,} events over {args.jobs:,} jobs ({args.events / args.jobs:g} per job), "
        f"`publish_events` calls of {args.batch};",
        "- route: `run_router --burst` subprocesses (manage.py; classic PUBLISH's through this script, "
        "eventbus.bus.delivery.publish_command patched) drain the backlog of the batched publish (the depth-1 "
        "one is flushed before it).",
        "",
        f"Placement: 3 masters: {three['placement']}. Shards per master (what the ratios below rest on):",
        "",
    ]
    for topology in topologies[:2]:
        out.append(
            f"- {topology['name']}: "
            + "; ".join(
                f"{name} {len(owned)} ({', '.join(owned)})" for name, owned in topology["shards"].items()
            )
        )
    out += [
        "",
        "### Rates and Redis CPU per event",
        "",
        f"| topology | publish events/s: depth 1 | {batched} | route events/s (routers) | "
        f"Redis CPU µs/event: publish depth 1 | {batched} | route | depth 1 + route | vs 1 master | "
        f"client CPU µs/event: publisher depth 1 | {batched} | routers |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = None
    for t in topologies:
        p, b, r = t["publish"], t["batched"], t["route"]
        pub_us, batch_us = us(sum(p["cpu"].values()), p["events"]), us(sum(b["cpu"].values()), b["events"])
        route_us = us(sum(r["cpu"].values()), r["events"])
        base = base or pub_us + route_us
        out.append(
            f"| {t['name']} | {p['rate']:,.0f} | {b['rate']:,.0f} | {r['rate']:,.0f} ({r['routers']}) | "
            f"{pub_us:.1f} | {batch_us:.1f} | {route_us:.1f} | {pub_us + route_us:.1f} | "
            f"{(pub_us + route_us) / base:.2f}x | {us(p['client_cpu'], p['events']):.1f} | "
            f"{us(b['client_cpu'], b['events']):.1f} | {us(sum(r['router_cpu']), r['events']):.1f} |"
        )
    out += [
        "",
        "Route events/s: the events over the time from the first router's start line to the last one's "
        "stop line in their logs (Django's start-up left out, from the routers' CPU too); "
        + "; ".join(
            f"{t['name']}: {t['route']['window'] or float('nan'):.2f} s of {t['route']['wall']:.2f} s with start-up"
            for t in topologies
        )
        + ".",
        "",
        "A call of publish_events reaches each master it has events for as one write of its script calls: "
        + "; ".join(
            f"{t['name']}: {t['batched']['events'] / t['batched']['writes']:.1f} calls per write"
            for t in topologies[:2]
        )
        + ". At depth 1 each write is one call, on either.",
        "",
        f"Depth 1 ran {len(rounds)} times on each, 1 master and 3 masters interleaved; the cluster's Redis "
        "CPU per event on 3 masters over 1 master's, round by round: "
        + " / ".join(f"{r:.2f}x" for r in rounds)
        + f". The tables show round {results['single_round'] + 1}, the median's (3 masters, PUBLISH: a "
        "depth-1 run of its own, informative).",
        "",
        "Commands per event at depth 1, every master's INFO commandstats (the bench's own INFO and "
        "CONFIG RESETSTAT left out): "
        + "; ".join(f"{t['name']}: {commands_per_event(t['publish'])}" for t in topologies[:2])
        + ".",
        "",
        "### Per master: publish",
        "",
        "| topology | master | shards | depth 1: events carried | CPU s | share | µs/event carried | "
        f"EVALSHA / COMMAND GETKEYS | {batched}: events carried | CPU s | share | µs/event carried | "
        "EVALSHA / COMMAND GETKEYS |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cells(phase: dict, name: str) -> str:
        total = sum(phase["cpu"].values())
        c = phase["commands"][name]
        return (
            f"{phase['carried'][name]:,} | {phase['cpu'][name]:.3f} | {phase['cpu'][name] / total:.3f} | "
            f"{us(phase['cpu'][name], phase['carried'][name]):.1f} | {c['evalsha']:,} / {c['command|getkeys']:,}"
        )

    for t in topologies:
        for name in t["publish"]["cpu"]:
            out.append(
                f"| {t['name']} | {name} | {len(t['shards'][name])} | {cells(t['publish'], name)} | "
                f"{cells(t['batched'], name)} |"
            )
    out += [
        "",
        "### Per master: route",
        "",
        "| topology | master | events carried | CPU s | share | µs/event carried | EVALSHA / COMMAND GETKEYS | "
        "PUBLISH / SPUBLISH |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for t in topologies:
        for name in t["route"]["cpu"]:
            c = t["route"]["commands"][name]
            out.append(
                f"| {t['name']} | {name} | {cells(t['route'], name)} | {c['publish']:,} / {c['spublish']:,} |"
            )
    lookups = {
        phase: sum(c["command|getkeys"] for t in topologies for c in t[phase]["commands"].values())
        for phase in ("publish", "batched", "route")
    }
    out.append("")
    if not any(lookups.values()):
        out.append(
            "COMMAND GETKEYS: none, on any master in any phase: the bus sends each master its script calls "
            "itself (eventbus.redis.internals._execute_on_cluster) and the router reads each master's streams in a "
            "pipeline of its own (eventbus.bus.router._read_cluster), so redis-py's cluster pipeline no longer "
            "asks a node the keys of every EVALSHA and XREADGROUP."
        )
    else:
        out.append(
            f"COMMAND GETKEYS: {lookups['publish']:,} at depth 1, {lookups['batched']:,} in {batched}, "
            f"{lookups['route']:,} while routing, where 0 is expected: some calls still went through redis-py's "
            "cluster pipeline (which asks a node the keys of every EVALSHA and XREADGROUP it queues), instead "
            "of straight to their master (eventbus.redis.internals._execute_on_cluster, eventbus.bus.router._read_cluster)."
        )
    idle = [rate for t in topologies for phase in ("publish", "batched") for rate in t[phase]["idle"]]
    out += [
        "",
        f"Background: a node of the cluster left idle meanwhile used {1000 * min(idle):.1f}-{1000 * max(idle):.1f} "
        "ms of CPU per second (serverCron, cluster bus); it is in the figures above, not subtracted. "
        + (
            "Redis CPU: each thread's run time from /proc/PID/task/*/schedstat (ns)."
            if SCHEDSTAT
            else "Redis CPU from /proc/PID/stat, in 10 ms ticks."
        ),
    ]

    # Targets: judged on the workers' path (depth 1) and the route; the batched publish informs.
    verdicts = []

    def judge(ok: bool, text: str) -> None:
        verdicts.append(f"{verdict(ok)}  {text}")

    def shares(phase: str) -> list[float]:
        cpu = three[phase]["cpu"]
        return [cpu[name] / sum(cpu.values()) for name in cpu]

    def ratio(phase: str) -> float:
        return cpu_ratio(three[phase], one[phase])

    def share_text(values: list[float]) -> str:
        return f"{' / '.join(f'{v:.3f}' for v in values)} within {low:.4f}-{high:.4f} (a third ±15 %)"

    labels = {"publish": "publish at depth 1", "route": "route"}
    for phase, label in labels.items():
        judge(
            all(low <= v <= high for v in shares(phase)),
            f"3 masters, {label}: each master's share of the cluster's Redis CPU {share_text(shares(phase))}",
        )
    of_rounds = {
        "publish": f", the median of {len(rounds)} rounds ({' / '.join(f'{r:.2f}x' for r in rounds)})",
        "route": "",
    }
    for phase, label in labels.items():
        judge(
            ratio(phase) <= CPU_RATIO_TARGET,
            f"3 masters, {label}: the cluster's Redis CPU per event {ratio(phase):.2f}x that of 1 master"
            f"{of_rounds[phase]} (target <= {CPU_RATIO_TARGET}x)",
        )
    verdicts.append(
        f"info  3 masters, publish in {batched}: each master's share of the cluster's Redis CPU "
        f"{share_text(shares('batched'))}"
    )
    verdicts.append(
        f"info  3 masters, publish in {batched}: the cluster's Redis CPU per event {ratio('batched'):.2f}x that "
        f"of 1 master, not judged: a call reaches each of 3 masters as "
        f"~{three['batched']['events'] / three['batched']['writes']:.0f} script calls in one write (1 master: "
        f"{one['batched']['events'] / one['batched']['writes']:.0f}), so Redis's per-read cost (read syscall, "
        "event-loop turn) is spread over a third as many events"
    )
    classic_ratio = (sum(classic["route"]["cpu"].values()) / classic["route"]["events"]) / (
        sum(three["route"]["cpu"].values()) / three["route"]["events"]
    )
    verdicts.append(
        f"info  3 masters, route: classic PUBLISH's Redis CPU per routed event {classic_ratio:.2f}x "
        "SPUBLISH's (the broadcast to every node that SPUBLISH removes)"
    )

    # Latency
    out += ["", "### Publish -> frame latency", ""]
    latency = results["latency"]
    if not latency:
        out.append("Not measured (--duration 0).")
    else:
        out += [
            "Not for classic PUBLISH: the gateway's hub (and the tap) listen with SSUBSCRIBE, which a "
            "PUBLISH does not reach.",
            "",
        ]
    for t_name, lat in latency.items():
        if lat.get("error"):
            out.append(f"- {t_name}: failed: {lat['error']}")
            continue
        tap = lat["tap"]
        line = (
            f"- {t_name}, {args.rate:,} events/s for {args.duration:.0f} s (publisher {lat['publisher_rate']:,.0f}/s, "
            f"lag p99 {lat['publisher_lag_p99_ms']:.2f} ms), routers running: "
        )
        if lat["via"] == "gateway":
            f = lat["frames"]
            dup, missing = lat["frames_check"]
            line += (
                f"WebSocket frames on {lat['sockets']} sockets (one daphne, its hub SSUBSCRIBEd on each master): "
                f"p50 {f['p50']} ms, p90 {f['p90']}, p99 {f['p99']}, max {f['max']}; "
                f"{lat['frames_received']:,} of {lat['expected']:,} frames, {dup} duplicated, {missing} missing"
                f"{', daphne logged ' + str(lat['daphne_errors']) + ' tracebacks' if lat['daphne_errors'] else ''}. "
            )
        else:
            line += (
                "**not through the gateway**: publish -> message on an SSUBSCRIBE subscriber"
                + (f" (the gateway failed: {lat['gateway_error']})" if lat["gateway_error"] else "")
                + ". "
            )
        tdup, tmissing = lat["tap_check"]
        line += (
            f"Publish -> SSUBSCRIBE message (the tap): p50 {tap['p50']} ms, p90 {tap['p90']}, p99 {tap['p99']}, "
            f"max {tap['max']}; {lat['tap_received']:,} of {lat['expected']:,}, {tdup} duplicated, {tmissing} missing"
            f"{' (its reader failed: ' + lat['tap_error'] + ')' if lat['tap_error'] else ''}. "
            f"CPU %: {', '.join(f'{k} {v}' for k, v in lat['cpu_percent'].items())}."
        )
        out.append(line)
        p99 = lat["frames"]["p99"] if lat["via"] == "gateway" else tap["p99"]
        what = "frame" if lat["via"] == "gateway" else "SSUBSCRIBE message"
        verdicts.append(
            f"info  {t_name}: publish -> {what} p99 {p99} ms at {args.rate:,}/s "
            f"(the frame target: <= {LATENCY_P99_MS:.0f} ms at 1,000/s with 200 sockets)"
        )
    from eventbus.bus import router as bus_router

    poll_min, poll_max = getattr(bus_router, "CLUSTER_POLL_MIN_MS", None), bus_router.CLUSTER_POLL_MS
    out += [
        "",
        f"The first {args.warmup:.0f} s of each run are warm-up (checked for exactly-once, left out of the "
        "percentiles). On a cluster a router of several streams cannot block on them (they live in several "
        "slots): it polls, "
        + (f"from {poll_min} ms doubling to " if poll_min else "up to ")
        + f"{poll_max} ms while nothing comes (eventbus.bus.router; at most --block-ms"
        + (f", {args.router_block_ms} ms in this run" if args.router_block_ms is not None else "")
        + "); a router of one stream blocks on it.",
    ]

    # Capacity: from the workers' path (depth 1) and the route.
    out += ["", "### What N masters would carry", ""]
    p3, r3 = three["publish"], three["route"]
    rows = [
        (name, p3["cpu"][name] / p3["carried"][name] + r3["cpu"][name] / r3["carried"][name])
        for name in p3["cpu"]
        if p3["carried"][name] and r3["carried"][name]
    ]
    one_cost = (
        sum(one["publish"]["cpu"].values()) / one["publish"]["events"]
        + sum(one["route"]["cpu"].values()) / one["route"]["events"]
    )
    out += [
        "Capacity of a master = 1 / (its Redis CPU seconds per event carried: publish at depth 1 + route) "
        "events/s per core:",
        "",
        f"- 1 master: {one_cost * 1e6:.1f} µs per event: {1 / one_cost:,.0f} events/s per core.",
    ]
    for name, cost in rows:
        out.append(f"- 3 masters, {name}: {cost * 1e6:.1f} µs per event carried: {1 / cost:,.0f} events/s.")
    if rows:
        mean = sum(cost for _, cost in rows) / len(rows)
        worst = max(cost for _, cost in rows)
        share = {name: r3["carried"][name] / r3["events"] for name in r3["carried"]}
        bound = min(1 / (cost * share[name]) for name, cost in rows if share[name])
        out += [
            "",
            f"With the shards spread evenly, N masters on N machines carry about N × {1 / mean:,.0f} events/s "
            f"(the mean of the three; N × {1 / worst:,.0f} by the costliest), e.g. {3 / mean:,.0f} events/s "
            f"for 3 and {10 / mean:,.0f} for 10, provided the publishers and routers are scaled out too. "
            f"Published in {batched}, the publish part costs less (see the table above).",
            f"With this run's placement and costs the busiest master is the limit: {bound:,.0f} events/s "
            "for these 3 masters (each master's share of the routed events).",
        ]
        extra = sum(classic["route"]["cpu"].values()) - sum(r3["cpu"].values())
        other_nodes = len(classic["route"]["cpu"]) - 1
        broadcast = extra / (classic["route"]["events"] * other_nodes) if extra > 0 else 0.0
        c = mean
        if broadcast:
            out.append(
                f"Classic PUBLISH adds {broadcast * 1e6:.1f} µs on each other node per routed event (this run: "
                f"{extra:.2f} CPU s more over {classic['route']['events']:,} events × {other_nodes} other "
                f"nodes, no subscriber anywhere); each master would then pay for every event of the cluster, "
                f"and N masters would carry N / ({c * 1e6:.1f} + (N-1) × {broadcast * 1e6:.1f}) µs: "
                + ", ".join(
                    f"{n} masters {n / (c + (n - 1) * broadcast):,.0f}/s (vs {n / c:,.0f})"
                    for n in (3, 10, 30)
                )
                + " events/s: the broadcast caps the cluster however many masters it gets.",
            )
        else:
            out.append(
                f"Classic PUBLISH cost no measurable extra Redis CPU in this run ({extra:+.2f} CPU s over "
                f"{classic['route']['events']:,} events): within the run's noise."
            )
    router_us = us(sum(r3["router_cpu"]), r3["events"])
    publisher_us = us(p3["client_cpu"], p3["events"])
    redis_us = us(sum(p3["cpu"].values()), p3["events"]) + us(sum(r3["cpu"].values()), r3["events"])
    out += [
        "",
        f"The other side of each event: {publisher_us:.0f} µs of the publisher's CPU (depth 1) and "
        f"{router_us:.0f} µs of the routers' against {redis_us:.0f} µs of Redis (3 masters): about "
        f"{(publisher_us + router_us) / redis_us:.1f} Python cores per Redis core. This {info['nproc']}-core "
        "machine runs every master, router and the publisher at once, so its raw events/s cannot show 3 "
        "masters carrying 3 times 1 master's; the figures above are CPU per event, which the sharing of "
        "cores does not change (much: caches and context switches do add to it).",
    ]
    return "\n".join(out), verdicts


BEGIN, END = "<!-- bench:cluster:begin -->", "<!-- bench:cluster:end -->"
PREAMBLE = """# Redis Cluster benchmark

`bench/cluster.py` (`make bench-cluster`) runs the event bus on two private Redis Clusters, 1 master
and 3 masters (shards spread by eventbus.redis.placement.balance), and on the 3 masters once more with
the routers publishing by classic PUBLISH. On each: a publish from one process at depth 1
(`publish_event`, one event per call: the workers' path) and in batches (`publish_events`), real
routers (`run_router --burst`) draining the batched backlog, then publish -> WebSocket frame
latency through a daphne; every Redis node's CPU comes from /proc. The targets (3 masters against
1: each master's share of the cluster's Redis CPU within a third ±15 %, Redis CPU per event <=
1.1x) are judged at depth 1 and on the route; the batched figures are informative.

    .venv/bin/python bench/cluster.py

Each run replaces the section between the markers below; the text above them is kept.
"""


def write_report(text: str, verdicts: list[str]) -> None:
    """This run's section of bench/REPORT-cluster.md, between its markers; the rest is kept."""
    section = f"{text}\n\n### Targets\n\n```\n" + "\n".join(verdicts) + "\n```"
    write_section(REPORT, section, BEGIN, END, PREAMBLE)


# --- main ---------------------------------------------------------------------------------------


def main() -> None:
    if sys.argv[1:2] == ["--wrapped-router"]:
        return wrapped_router(sys.argv[2:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=60_000, help="events published, then routed")
    parser.add_argument("--jobs", type=int, default=3_000, help="jobs the events spread over")
    parser.add_argument("--shards", type=int, default=6, help="shards of each domain (a multiple of 3)")
    parser.add_argument("--batch", type=int, default=50, help="events per publish_events call")
    parser.add_argument(
        "--single-events",
        type=int,
        default=20_000,
        help="events published at depth 1 (one publish_event call each), on as many jobs as give "
        "each job the events per job of --events over --jobs",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of the depth-1 publish on 1 and 3 masters, interleaved: its targets are judged on "
        "the run of the median ratio",
    )
    parser.add_argument("--rate", type=int, default=1000, help="events/s of the latency runs")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of each latency run (0: none)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds left out of the percentiles")
    parser.add_argument(
        "--drain", type=float, default=5.0, help="seconds without a new frame before giving up"
    )
    parser.add_argument("--sockets", type=int, default=200, help="WebSockets (and jobs) of the latency runs")
    parser.add_argument("--latency-via", choices=("gateway", "ssubscribe"), default="gateway")
    parser.add_argument(
        "--router-block-ms",
        type=int,
        help="--block-ms of the latency runs' routers (default: theirs, EVENTBUS['ROUTER_BLOCK_MS'])",
    )
    parser.add_argument("--timeout", type=float, default=180, help="seconds a route phase may take")
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    if args.shards % 3:
        parser.error("--shards must be a multiple of 3")
    if args.repeats < 1 or not args.repeats % 2:
        parser.error("--repeats must be odd (its median is one of the rounds)")
    if args.batch < 2 or args.jobs < 1:
        parser.error("--batch must be above 1 (depth 1 is measured anyway), --jobs above 0")
    if min(args.events, args.single_events) <= args.batch:
        parser.error("--events and --single-events must be above --batch (the first --batch are the warm-up)")

    started = time.time()
    load_start = load_line()
    print(load_start, flush=True)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    print(f"logs in {log_dir} (removed after a run without error)", flush=True)
    clusters: list[Cluster] = []
    plain = None
    ctx: dict = {"log_dir": log_dir, "publishers": [], "env": {}}

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        plain = RedisServer().start()
        clusters = [Cluster(1), Cluster(3)]
        database_url = "sqlite:///" + str(log_dir / "bench.sqlite3")
        maxlen = max(10_000, 2 * args.events)
        for cluster in clusters:
            ctx["env"][cluster.url] = bench_env(cluster.url, plain.url, database_url, args.shards, maxlen)
        os.environ.update(ctx["env"][clusters[0].url], LOG_LEVEL="WARNING")
        import django

        django.setup()
        from django.test.utils import override_settings

        print(f"placement: {clusters[1].balance()} (the 3-master cluster)", flush=True)
        for cluster in clusters:
            cluster.load_scripts()
        topologies = [
            Topology("1 master", clusters[0], "SPUBLISH"),
            Topology("3 masters", clusters[1], "SPUBLISH"),
            Topology("3 masters, PUBLISH", clusters[1], "PUBLISH"),
        ]
        for topology in topologies[:2]:
            print(
                f"shards per master, {topology.name}: "
                + "; ".join(f"{name} {len(owned)}" for name, owned in topology.shards.items()),
                flush=True,
            )
        batch = workload(args.events, args.jobs)
        singles = workload(args.single_events, single_jobs(args), prefix="single")
        results: dict = {"topologies": [], "latency": {}}
        # The depth-1 publish on 1 and 3 masters, --repeats rounds of both, interleaved: a shared
        # machine's noise hits both sides of a round's ratio alike; the median round judges.
        singles_runs: dict[str, list[dict]] = {t.name: [] for t in topologies[:2]}
        for round_ in range(args.repeats):
            for topology in topologies[:2]:
                others = [c for c in clusters if c is not topology.cluster]
                with override_settings(REDIS_URL=topology.cluster.url):
                    run = publish_phase(topology, singles, 1, args.batch, others)
                singles_runs[topology.name].append(run)
                print(
                    f"{topology.name}: publish at depth 1, round {round_ + 1}: {run['rate']:,.0f} events/s, "
                    f"Redis CPU {sum(run['cpu'].values()):.2f} s",
                    flush=True,
                )
        one_runs, three_runs = singles_runs[topologies[0].name], singles_runs[topologies[1].name]
        results["single_ratios"] = [cpu_ratio(three, one) for one, three in zip(one_runs, three_runs)]
        middle = sorted(results["single_ratios"])[(args.repeats - 1) // 2]
        results["single_round"] = results["single_ratios"].index(middle)
        for topology in topologies:
            others = [c for c in clusters if c is not topology.cluster]
            with override_settings(REDIS_URL=topology.cluster.url):
                publish = {}
                if topology.name in singles_runs:
                    publish[1] = singles_runs[topology.name][results["single_round"]]
                else:
                    publish[1] = publish_phase(topology, singles, 1, args.batch, others)
                publish[args.batch] = publish_phase(topology, batch, args.batch, args.batch, others)
                for depth in (1, args.batch):
                    print(
                        f"{topology.name}: publish at depth {depth}: {publish[depth]['rate']:,.0f} events/s, "
                        f"Redis CPU {sum(publish[depth]['cpu'].values()):.2f} s",
                        flush=True,
                    )
                route = route_phase(topology, batch, ctx["env"][topology.cluster.url], log_dir, args.timeout)
                print(
                    f"{topology.name}: route {route['rate']:,.0f} events/s ({route['routers']} routers), "
                    f"Redis CPU {sum(route['cpu'].values()):.2f} s",
                    flush=True,
                )
            results["topologies"].append(
                {
                    "name": topology.name,
                    "shards": topology.shards,
                    "placement": topology.cluster.placement,
                    "publish": publish[1],
                    "batched": publish[args.batch],
                    "route": route,
                }
            )

        if args.duration > 0:
            session_key = ""
            fixture_jobs: list[str] = []
            if args.latency_via == "gateway":
                from django.core.management import call_command
                from django.db import connections

                call_command("migrate", verbosity=0, interactive=False)
                session_key, fixture_jobs = create_fixtures(2 * args.sockets)
                connections.close_all()
            ctx["session_key"] = session_key
            for i, topology in enumerate(topologies[:2]):
                jobs = fixture_jobs[i * args.sockets : (i + 1) * args.sockets] or [
                    f"latency-{i}-{n}" for n in range(args.sockets)
                ]
                with override_settings(REDIS_URL=topology.cluster.url):
                    try:
                        lat = asyncio.run(latency_phase(topology, ctx, args, jobs))
                    except Exception as exc:
                        lat = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
                results["latency"][topology.name] = lat
                print(f"{topology.name}: latency {lat.get('frames') or lat.get('tap') or lat}", flush=True)

        redis_version = clusters[0].direct[next(iter(clusters[0].direct))].info("server")["redis_version"]
    finally:
        for publisher in ctx["publishers"]:
            publisher.kill()
        for cluster in clusters:
            cluster.stop()
        if plain:
            plain.stop()

    info = {
        **run_info("bench/cluster.py"),
        "redis": redis_version,
        "load_start": load_start,
        "load_end": load_line(),
        "seconds": time.time() - started,
    }
    text, verdicts = render(results, args, info)
    print()
    print(text)
    print()
    print("\n".join(verdicts))
    print(info["load_end"])
    if not args.no_report:
        write_report(text, verdicts)
        print(f"written to {REPORT}")
    import shutil

    shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
