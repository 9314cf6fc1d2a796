#!/usr/bin/env python
"""Gateway benchmark (the README's Measured table): a script, never a test.

One run starts a private Redis, a database of its own (a SQLite file; on the PostgreSQL server
of DATABASE_URL when that is PostgreSQL), migrates it, creates a user with a session and
--jobs jobs (Job rows owned by the user), then one server process (uvicorn by default) serving config.asgi
(config.settings.production: DEBUG off) and one `manage.py run_router`, and measures:

1. Sockets held: --sockets WebSocket connections to /ws/jobs/<id>/ (session cookie, Origin),
   spread over the jobs, opened from this process (asyncio, bench.ws_light's protocol: no task
   per socket; --client websockets for the library's) --connect-concurrency at a time, from
   127.0.0.1-127.0.0.<SOURCE_ADDRESSES> (ephemeral ports); at checkpoints: sockets open, the
   server's RSS (/proc VmRSS), the Redis connections (CLIENT LIST, TYPE pubsub, and which process
   holds each), the job channels subscribed. At 5,000 sockets and again with every socket held:
   fan-out rounds (one event to every job) and a Redis blip (the hub's pub/sub connection killed:
   every socket resyncs), timed to the last socket.
2. Publish -> frame latency: --latency-sockets sockets on --latency-jobs fresh jobs, a publisher
   process calling eventbus.publish_event at --rate events/s for --duration s (each event's data
   carries time.time_ns() at publish), the router routing them; every frame's
   receive_time - publish_time, and every frame checked: exactly once (duplicates and missing
   counted). A tap (a pattern subscription of this process on the job channels) times the
   router's PUBLISH too, which splits the latency into eventbus (publish -> PUBLISH) and
   gateway (PUBLISH -> frame). --runs runs, each on fresh sockets and jobs.
3. A table of PASS/MISS per target. When the latency target is missed (or --profile
   always), one more run, not counted, with py-spy on the server and on the router; its hottest
   frames go to the report.

    .venv/bin/python bench/gateway.py [--sockets 5000] [--jobs 1000] [--runs 3] [--duration 20]

Results are printed and written between the markers of bench/REPORT-gateway.md (the rest of
that file is the analysis); raw figures go to bench/results/gateway-*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import gc
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.database import BenchDatabase
from bench.processes import Process, cpu_seconds, wait_port
from bench.procstat import CLOCK_TICKS, run_info
from bench.profiling import Profiler
from bench.report import markdown_table, verdict, write_section
from bench.stats import median, percentile, percentiles
from config.redis_server import RedisServer, free_port  # noqa: E402

BIN = Path(sys.executable).parent
REPORT = ROOT / "bench" / "REPORT-gateway.md"
RESULTS_DIR = ROOT / "bench" / "results"
BEGIN, END = "<!-- bench:results:begin -->", "<!-- bench:results:end -->"
SECRET_KEY = "bench-gateway-only-not-a-secret"
DOMAIN = "scan"
STAGE = "bench"
CHANNEL_PATTERN = "*:channel:*"

# The targets (the README's Measured table)
TARGET_SOCKETS = 25000  # held by one process
TARGET_P99_MS = 10.0  # publish -> frame p99 at TARGET_RATE events/s with TARGET_LATENCY_SOCKETS
TARGET_RATE = 1000
TARGET_LATENCY_SOCKETS = 200
TARGET_HEAVY_P99_MS = 25.0  # ... and at TARGET_HEAVY_RATE events/s with TARGET_HEAVY_SOCKETS
TARGET_HEAVY_RATE = 5000
TARGET_HEAVY_SOCKETS = 1000
TARGET_FANOUT = 20000  # frames/s of one process: one event to each of 1,000 jobs, 5,000 sockets
TARGET_KIB_PER_SOCKET = 16.0  # at TARGET_SOCKETS
TARGET_RESYNC_P99_MS = 300.0  # every one of 5,000 sockets has the event published after a blip
TARGET_RESYNC_ALL_P99_MS = 1000.0  # ... and every one of the TARGET_SOCKETS sockets held
# Where the clients share the CPUs with the server, the resync is also judged by the server's CPU:
# at most this many times that of the plain fan-out of the same frames.
TARGET_RESYNC_CPU_RATIO = 2.5
PROBE_SOCKETS = 5000  # the fan-out and blip probes run with this many sockets held
# Client sockets come from 127.0.0.1 .. 127.0.0.<SOURCE_ADDRESSES>, round robin: 25,000 sockets to
# one server port from one address would take nearly every ephemeral port (32768-60999).
SOURCE_ADDRESSES = 4
# py-spy's rate on the server during the probes (--profile-probes): a resync is a few hundred ms of
# CPU, a few dozen samples at py-spy's default 100 Hz.
PROBE_PROFILE_RATE = 1000


# --- processes and /proc ----------------------------------------------------------------------


def rss_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, kB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            name, value = line.split(":", 1)
            found[name] = int(value.split()[0])
    return found


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    total = sum(values[:8])
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS


def socket_ports(pid: int) -> set[int]:
    """Local TCP ports of the sockets a process holds (its fds matched to /proc/net/tcp*)."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return set()
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def redis_connections(client, owners: dict[str, int]) -> dict:
    """CLIENT LIST: the total, TYPE pubsub, and each connection's owner process."""
    clients = client.client_list()
    pubsub_ids = {c["id"] for c in client.client_list(_type="pubsub")}
    ports = {name: socket_ports(pid) for name, pid in owners.items()}
    by_owner: dict[str, dict[str, int]] = {}
    for c in clients:
        port = int(c["addr"].rsplit(":", 1)[1])
        owner = next((name for name, held in ports.items() if port in held), "other")
        entry = by_owner.setdefault(owner, {"all": 0, "pubsub": 0})
        entry["all"] += 1
        entry["pubsub"] += c["id"] in pubsub_ids
    return {"total": len(clients), "pubsub": len(pubsub_ids), "by_owner": by_owner}


# --- setup ------------------------------------------------------------------------------------


def bench_env(redis_url: str, database_url: str) -> dict:
    """The environment of the server, the router, the publisher and this process's Django."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.production",  # DEBUG off
        DJANGO_SECRET_KEY=SECRET_KEY,
        ALLOWED_HOSTS="127.0.0.1,localhost",
        REDIS_URL=redis_url,
        DATABASE_URL=database_url,
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
        MAX_SOCKETS_PER_USER="0",  # every socket is the bench user's
    )
    return env


def setup_django() -> None:
    import django

    django.setup()


def create_fixtures(jobs: int) -> tuple[str, list[str]]:
    """A user, a logged-in session (its key) and `jobs` jobs of that user (their ids)."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.contrib.sessions.backends.db import SessionStore

    from eventbus.models import Job

    user = get_user_model().objects.create_user("bench", password=None)
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.save()
    rows = [
        Job(
            scope=f"bench:{user.pk}",
            idem_key=f"bench-{i}",
            owner=user,
            domain=DOMAIN,
            event_type="bench",
            state=Job.State.RUNNING,
        )
        for i in range(jobs)
    ]
    Job.objects.bulk_create(rows, batch_size=500)
    assert session.session_key is not None  # saved above
    return session.session_key, [str(row.id) for row in rows]


SERVER_NAMES = {
    "uvicorn": "server: uvicorn --ws gateway.uvicorn:WebSocketProtocol --ws-per-message-deflate false",
    "uvicorn-sansio": "server: uvicorn --ws websockets-sansio",
    "daphne": "server: daphne",
    "uvicorn-legacy": "server: uvicorn --ws websockets (legacy)",
}


def server_command(server: str, port: int, options: Sequence[str] = ()) -> list[str]:
    """The gateway's one process: uvicorn as the Procfile runs it, uvicorn's own websockets-sansio
    protocol (with its defaults), daphne, or uvicorn's legacy websockets protocol."""
    if server.startswith("uvicorn"):
        ws = {
            "uvicorn": "gateway.uvicorn:WebSocketProtocol",
            "uvicorn-sansio": "websockets-sansio",
            "uvicorn-legacy": "websockets",
        }[server]
        return [
            str(BIN / "uvicorn"),
            "config.asgi:application",
            *("--host", "127.0.0.1", "--port", str(port), "--ws", ws, "--lifespan", "off"),
            # As the Procfile runs it: a compressor and a decompressor per socket cost 36 KiB.
            *(("--ws-per-message-deflate", "false") if server == "uvicorn" else ()),
            *("--log-level", "warning", "--no-access-log"),
            *options,
        ]
    return [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), *options, "config.asgi:application"]


def wait_router(child: Process, client, timeout: float = 60) -> None:
    """Ready when its group has a consumer on every stream (it has issued XREADGROUP)."""
    from eventbus.bus.delivery import streams_for

    keys = [stream.key for stream in streams_for(None)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            break
        try:
            if all(any(g["consumers"] for g in client.xinfo_groups(key)) for key in keys):
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the router did not start:\n{child.log(tail=3000)}")


# --- WebSocket clients ------------------------------------------------------------------------


class Target:
    def __init__(self, port: int, session_key: str, deflate: bool = False, light: bool = True):
        self.port, self.session_key, self.deflate, self.light = port, session_key, deflate, light

    async def connect_held(self, job_id: str, i: int):
        """Socket i of the held ones: bench.ws_light's (or the library's, --client websockets), from
        one of the SOURCE_ADDRESSES."""
        source = f"127.0.0.{1 + i % SOURCE_ADDRESSES}"
        if not self.light:
            return await self.connect(job_id, local_addr=(source, 0))
        from bench import ws_light

        return await ws_light.connect(
            "127.0.0.1",
            self.port,
            f"/ws/jobs/{job_id}/",
            {"Origin": f"http://127.0.0.1:{self.port}", "Cookie": f"sessionid={self.session_key}"},
            deflate=self.deflate,
            source=source,
        )

    def url(self, job_id: str) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/jobs/{job_id}/"

    async def connect(self, job_id: str, **kwargs):
        from websockets.asyncio.client import connect
        from websockets.typing import Origin

        return await connect(
            self.url(job_id),
            origin=Origin(f"http://127.0.0.1:{self.port}"),
            additional_headers={"Cookie": f"sessionid={self.session_key}"},
            # permessage-deflate offered as browsers do (the server may decline), unless --no-deflate.
            compression="deflate" if self.deflate else None,
            proxy=None,
            ping_interval=None,  # server pings idle sockets itself; the library answers
            open_timeout=60,
            close_timeout=10,
            **kwargs,
        )


async def open_sockets(
    target: Target, jobs: list[str], count: int, concurrency: int, start: int = 0, held: bool = False
):
    """Open sockets start..count-1, socket i on jobs[i % len(jobs)]; (sockets, handshake s, failures).
    `held`: the held sockets' client (Target.connect_held), else the library's."""
    semaphore = asyncio.Semaphore(concurrency)
    opened: list = []
    handshakes: list[float] = []
    failures: collections.Counter[str] = collections.Counter()

    async def one(i: int):
        # A failed handshake is counted and tried once more, as a browser would reconnect.
        for attempt in (1, 2):
            async with semaphore:
                began = time.perf_counter()
                try:
                    job = jobs[i % len(jobs)]
                    ws = await (target.connect_held(job, i) if held else target.connect(job))
                except Exception as exc:  # counted, the bench goes on
                    failures[f"attempt {attempt}: {type(exc).__name__}: {str(exc)[:100]}"] += 1
                    continue
                handshakes.append(time.perf_counter() - began)
                opened.append((i, ws))
                return

    await asyncio.gather(*(one(i) for i in range(start, count)))
    opened.sort(key=lambda pair: pair[0])
    return [ws for _, ws in opened], handshakes, failures


async def close_sockets(sockets: list, concurrency: int = 200) -> None:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(ws):
        async with semaphore:
            try:
                await ws.close()
            except Exception:
                pass

    await asyncio.gather(*(one(ws) for ws in sockets))


def open_count(sockets: list) -> int:
    from websockets.protocol import State

    from bench.ws_light import LightSocket

    return sum(ws.is_open if isinstance(ws, LightSocket) else ws.state is State.OPEN for ws in sockets)


async def wait_channels(client, expected: int, timeout: float = 60) -> tuple[int, float]:
    """Wait until `expected` job channels are subscribed (PUBSUB CHANNELS); (count, seconds)."""
    began = time.perf_counter()
    while True:
        count = len(client.pubsub_channels(CHANNEL_PATTERN))
        if count == expected or time.perf_counter() - began > timeout:
            return count, time.perf_counter() - began
        await asyncio.sleep(0.05)


# --- 1. sockets held --------------------------------------------------------------------------


async def hold_sockets(ctx, args) -> dict:
    client, target, server = ctx["client"], ctx["target"], ctx["server"]
    jobs = ctx["jobs"][: args.jobs]
    probe_at = min(PROBE_SOCKETS, args.sockets)
    checkpoints = sorted({c for c in (200, 1000, 2000, probe_at, args.sockets) if c <= args.sockets})
    result = {"jobs": len(jobs), "concurrency": args.connect_concurrency, "checkpoints": []}
    result["before"] = {"rss": rss_kb(server.pid), "redis": redis_connections(client, ctx["owners"]())}
    sockets: list = []
    handshakes: list[float] = []
    failures: collections.Counter[str] = collections.Counter()
    began, opened, seq = time.perf_counter(), 0, 0
    for checkpoint in checkpoints:
        step_began = time.perf_counter()
        new, times, failed = await open_sockets(
            target, jobs, checkpoint, args.connect_concurrency, start=opened, held=True
        )
        opened = checkpoint
        sockets += new
        handshakes += times
        failures += failed
        step_seconds = time.perf_counter() - step_began
        channels, _ = await wait_channels(client, min(checkpoint, len(jobs)))
        numsub = client.pubsub_numsub(*client.pubsub_channels(CHANNEL_PATTERN)[:50])
        point: dict = {
            "sockets": checkpoint,
            "open": open_count(sockets),
            "seconds": round(step_seconds, 2),
            "rss": rss_kb(server.pid),
            "channels": channels,
            "max_subscribers_per_channel": max((n for _, n in numsub), default=0),
            "redis": redis_connections(client, ctx["owners"]()),
            "server_fds": len(os.listdir(f"/proc/{server.pid}/fd")),
        }
        result["checkpoints"].append(point)
        print(
            f"  {point['open']:>5} sockets open ({step_seconds:.1f} s for this step); server RSS "
            f"{point['rss']['VmRSS'] / 1024:.0f} MiB; Redis connections {point['redis']['total']} "
            f"(server {point['redis']['by_owner'].get('server', {})}); {channels} channels",
            flush=True,
        )
        if checkpoint == probe_at:
            # The probes at the targets' count: fan-out rounds, then a Redis blip.
            if args.fanout_rounds:
                result["fanout"], seq = await fanout_rounds(ctx, sockets, jobs, seq, args.fanout_rounds)
            if args.blip:
                seq += 1
                result["blip"] = await redis_blip(ctx, sockets, jobs, seq)
                print_blip(result["blip"])
    result["connect_seconds"] = round(time.perf_counter() - began, 2)
    await asyncio.sleep(args.hold)
    result.update(
        attempted=args.sockets,
        held=open_count(sockets),
        held_after_seconds=args.hold,
        failures=dict(failures),
        closed_codes=dict(collections.Counter(ws.close_code for ws in sockets if ws.close_code is not None)),
        handshake_ms=percentiles([h * 1000 for h in handshakes], "p50", "p99", "max", digits=1),
        rss_held=rss_kb(server.pid),
        redis_held=redis_connections(client, ctx["owners"]()),
    )
    print(f"  held {result['held']} of {args.sockets} after {args.hold:.0f} s", flush=True)
    if args.sockets > probe_at and args.fanout_rounds:
        result["fanout_all"], seq = await fanout_rounds(ctx, sockets, jobs, seq, args.fanout_rounds)
    if args.sockets > probe_at and args.blip:
        # Every socket held resyncs after a blip.
        seq += 1
        result["blip_all"] = await redis_blip(ctx, sockets, jobs, seq)
        print_blip(result["blip_all"])
    print("  closing", flush=True)
    await close_sockets(sockets)
    channels, seconds = await wait_channels(client, 0)
    await asyncio.sleep(1)
    result["after_close"] = {
        "channels": channels,
        "unsubscribed_in": round(seconds, 2),
        "rss": rss_kb(server.pid),
        "redis": redis_connections(client, ctx["owners"]()),
    }
    return result


def print_blip(b: dict) -> None:
    print(
        f"  Redis blip: hub's pub/sub connection killed; channels back in {b['resubscribed_in']} s; "
        f"server's Redis connections peaked at {b['peak_server']} (were {b['server_before']}); a frame "
        f"published right after reached {b['probe']['received']} of {b['probe']['sockets']} sockets, p99 "
        f"{b['probe']['ms']['p99']} ms, the last after {b['probe']['ms']['max']} ms; server CPU "
        f"{b['probe']['server_cpu_ms']} ms, clients' {b['probe']['client_cpu_ms']} ms; sockets still open "
        f"{b['still_open']}",
        flush=True,
    )


async def fanout_rounds(ctx, sockets: list, jobs: list[str], seq: int, rounds: int) -> tuple[dict, int]:
    """`rounds` fan-out probes, one after the other: the median round's figures, and the last seq."""
    done = []
    profiler = None
    if ctx.get("profile_probes"):  # attached first: attaching stalls the target a moment
        profiler = Profiler(
            "server-fanout", ctx["server"].pid, rounds * 1.5 + 3, ctx["log_dir"], rate=PROBE_PROFILE_RATE
        )
        await asyncio.sleep(1.5)
    for _ in range(rounds):
        seq += 1
        done.append(await probe(ctx, sockets, jobs, seq))
    done.sort(key=lambda r: r["frames_per_cpu_s"])
    middle = dict(done[len(done) // 2])
    middle["rounds"] = [
        {"frames_per_s": r["frames_per_s"], "server_cpu_ms": r["server_cpu_ms"]} for r in done
    ]
    if profiler is not None:
        middle["profile"] = await asyncio.get_running_loop().run_in_executor(None, profiler.finish)
        middle["profile"].update(seconds=profiler.seconds, rate=profiler.rate)
    print(
        f"  fan-out, {len(sockets)} sockets, {rounds} round(s): {middle['received']} frames each, the last after "
        f"{middle['ms']['max']} ms: {middle['frames_per_s']:,.0f} frames/s (median); server CPU "
        f"{middle['server_cpu_ms']} ms per round ({middle['frames_per_cpu_s']:,.0f} frames per CPU-second); "
        f"clients' CPU {middle['client_cpu_ms']} ms",
        flush=True,
    )
    return middle, seq


async def probe(ctx, sockets: list, jobs: list[str], seq: int, timeout: float = 60) -> dict:
    """Publish one event (this seq) to every job at once (publish_events, one round trip) and
    time its frame on every socket (socket i is on jobs[i % len(jobs)]); frames/s is the sockets
    reached over the time to the last one, and the server's CPU time over the same span."""
    from eventbus import publish_events

    server = ctx["server"].pid
    marker = f'"seq":{seq},'.encode()  # eventbus.bus.events writes compact JSON
    cpu_before, client_before = cpu_seconds(server), time.process_time()
    sent_ns = time.time_ns()
    publish_events([(DOMAIN, job, STAGE, seq, {"t": sent_ns, "probe": seq}) for job in jobs])

    from bench.ws_light import LightSocket, Probe

    if sockets and isinstance(sockets[0], LightSocket):
        # Cheapest on this side (the clients share the machine with the server): each socket's
        # protocol hands its frames to the probe as they are parsed; no task, no JSON.
        waiting = Probe(marker, sockets)
        try:
            await asyncio.wait_for(asyncio.shield(waiting.done), timeout)
        except TimeoutError:
            pass
        cpu = cpu_seconds(server) - cpu_before
        waiting.cancel(sockets)
        arrived = sorted((ns - sent_ns) / 1e6 for ns in waiting.arrived_ns)
    else:

        async def one(ws):
            # No timer per frame, no JSON; the gateway sends the router's bytes as they are.
            while True:
                raw = await ws.recv(decode=False)
                if marker in raw and raw.startswith(b'{"type":"event"'):
                    return (time.time_ns() - sent_ns) / 1e6

        tasks = [asyncio.ensure_future(one(ws)) for ws in sockets]
        await asyncio.wait(tasks, timeout=timeout)
        cpu = cpu_seconds(server) - cpu_before
        for task in tasks:
            task.cancel()
        arrived = sorted(
            t.result() for t in tasks if t.done() and not t.cancelled() and t.exception() is None
        )
    last = arrived[-1] / 1000 if arrived else 0
    return {
        "received": len(arrived),
        "sockets": len(sockets),
        "ms": percentiles(arrived, "p50", "p99", "max", digits=1),
        "frames_per_s": round(len(arrived) / last) if last else 0,
        "server_cpu_ms": round(cpu * 1000),
        "frames_per_cpu_s": round(len(arrived) / cpu) if cpu else 0,
        # This process's (the clients', all threads): the load generator's share of the machine.
        "client_cpu_ms": round((time.process_time() - client_before) * 1000),
    }


async def redis_blip(ctx, sockets: list, jobs: list[str], seq: int, watch: float = 8.0) -> dict:
    """CLIENT KILL the hub's pub/sub connection (a Redis blip): the hub reconnects, resubscribes
    and resyncs every socket (a backfill each). How many Redis connections does that take, and
    how long until an event published right after reaches every socket?"""
    client, server = ctx["client"], ctx["server"]
    channels = min(len(sockets), len(jobs))

    def server_connections() -> int:
        return redis_connections(client, {"server": server.pid})["by_owner"].get("server", {}).get("all", 0)

    before = server_connections()
    # Others' connections (the router's, this process's) stay as they are: the server's during the
    # resync are the total less those. Attributing each connection to its process reads every fd of
    # the server and of this process and all of /proc/net/tcp (tens of thousands of lines with the
    # sockets held): done while the clients wait for their frames, it stalled them for seconds.
    others = len(client.client_list()) - before
    peak, back_in = before, None
    began = time.perf_counter()

    async def watch_connections():
        nonlocal peak, back_in
        while time.perf_counter() - began < watch:
            await asyncio.sleep(0.2)
            peak = max(peak, len(client.client_list()) - others)
            if back_in is None and len(client.pubsub_channels(CHANNEL_PATTERN)) == channels:
                back_in = round(time.perf_counter() - began, 2)

    profiler = None
    if ctx.get("profile_probes"):  # attached first: attaching stalls the target a moment
        profiler = Profiler("server-blip", server.pid, 5, ctx["log_dir"], rate=PROBE_PROFILE_RATE)
        await asyncio.sleep(1.5)
        began = time.perf_counter()
    killed = client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    watcher = asyncio.create_task(watch_connections())
    arrival = await probe(ctx, sockets, jobs, seq)
    await watcher
    if profiler is not None:
        arrival["profile"] = await asyncio.get_running_loop().run_in_executor(None, profiler.finish)
        arrival["profile"].update(seconds=profiler.seconds, rate=profiler.rate)
        ctx["profile_probes"] = False  # the fan-out rounds at every socket go unprofiled
    return {
        "killed": killed,
        "resubscribed_in": back_in,
        "server_before": before,
        "peak_server": peak,
        "server_after": server_connections(),
        "still_open": open_count(sockets),
        "probe": arrival,
        "rss": rss_kb(server.pid),
    }


# --- 2. publish -> frame latency --------------------------------------------------------------


def quiet_gc() -> None:
    """The load generators (this process's clients, the publisher) run without the cyclic GC
    during a latency run: a full collection of a process that holds Django and 100,000 frames
    pauses it for tens of ms, and that pause would be counted as the pipeline's latency (the
    clients stamp a frame when they get to it; the publisher falls behind its schedule)."""
    gc.collect()
    gc.disable()


def publisher_main(args) -> None:
    """The publisher process: --rate events/s for --duration s, round robin over the jobs. Above
    1,000 events/s it publishes one batch a millisecond (publish_events: one round trip), so
    that the rate is the bus's and not this process's round trips."""
    setup_django()
    from eventbus import publish_event, publish_events

    jobs = json.loads(Path(args.publisher).read_text())
    total = int(args.rate * args.duration)
    batch = max(1, args.rate // 1000)
    interval = batch / args.rate
    lags, calls = [], []
    perf, sleep, now_ns = time.perf_counter, time.sleep, time.time_ns
    quiet_gc()
    print("ready", flush=True)
    cpu_start = time.process_time()
    start = perf() + 0.1
    for first in range(0, total, batch):
        due = start + (first // batch) * interval
        wait = due - perf()
        if wait > 0:
            sleep(wait)
        began = perf()
        if batch == 1:
            publish_event(
                DOMAIN, jobs[first % len(jobs)], STAGE, first // len(jobs) + 1, {"t": now_ns(), "i": first}
            )
        else:
            t = now_ns()
            publish_events(
                [
                    (DOMAIN, jobs[i % len(jobs)], STAGE, i // len(jobs) + 1, {"t": t, "i": i})
                    for i in range(first, min(first + batch, total))
                ]
            )
        ended = perf()
        lags.append(began - due)
        calls.append(ended - began)
    elapsed = perf() - start
    cpu = time.process_time() - cpu_start
    print(
        json.dumps(
            {
                "published": total,
                "seconds": elapsed,
                "cpu_seconds": cpu,
                "rate": total / elapsed,
                "lag_ms": percentiles([lag * 1000 for lag in lags], "p50", "p99", "max"),
                "late_1ms": sum(lag > 0.001 for lag in lags),
                "final_lag_ms": (perf() - (start + (total - 1) // batch * interval)) * 1000 if total else 0,
                "call_ms": percentiles([call * 1000 for call in calls], "p50", "p99", "max"),
            }
        ),
        flush=True,
    )


async def record_frames(ws, sink: list) -> None:
    """Each frame of the socket with the time it arrived (time.time_ns()), until it closes."""
    from websockets.exceptions import ConnectionClosed

    try:
        async for raw in ws:
            sink.append((time.time_ns(), raw))
    except ConnectionClosed:
        pass


async def latency_run(ctx, args, run: int, first: int, profile: bool = False) -> dict:
    """One run at args.rate events/s on args.latency_sockets sockets over args.latency_jobs
    fresh jobs (no history to backfill), ctx["jobs"][first:]."""
    client, target, server, router = ctx["client"], ctx["target"], ctx["server"], ctx["router"]
    jobs = ctx["jobs"][first : first + args.latency_jobs]

    sockets, _, failures = await open_sockets(target, jobs, args.latency_sockets, args.connect_concurrency)
    if failures or len(sockets) != args.latency_sockets:
        raise RuntimeError(
            f"latency run: {len(sockets)} of {args.latency_sockets} sockets opened: {dict(failures)}"
        )
    subscribed, _ = await wait_channels(client, len(jobs))
    frames: list[list] = [[] for _ in sockets]
    readers = [asyncio.create_task(record_frames(ws, sink)) for ws, sink in zip(sockets, frames)]

    # The tap: this process's own pattern subscription sees each router PUBLISH.
    tapped: list = []
    tap_task = None
    if args.tap:
        import redis.asyncio as aioredis

        tap_client = aioredis.Redis.from_url(ctx["redis_url"])
        tap = tap_client.pubsub()
        await tap.psubscribe(CHANNEL_PATTERN)
        await tap.get_message(timeout=1.0)  # the psubscribe confirmation

        async def tap_reader():
            while True:
                message = await tap.get_message(timeout=1.0)
                if message and message["type"] == "pmessage":
                    tapped.append((time.time_ns(), message["data"]))

        tap_task = asyncio.create_task(tap_reader())

    jobs_file = ctx["log_dir"] / f"jobs-{run}.json"
    jobs_file.write_text(json.dumps(jobs))
    publisher = Process(
        sys.executable,
        str(Path(__file__).resolve()),
        *("--publisher", str(jobs_file), "--rate", str(args.rate), "--duration", str(args.duration)),
        name=f"publisher-{run}",
        environ=ctx["env"],
        log_dir=ctx["log_dir"],
        pipe=True,
    ).start()
    ctx["publishers"].append(publisher)
    loop = asyncio.get_running_loop()
    profilers = []
    if profile:  # attached before the publishing starts: attaching stalls the target a moment
        profilers = [
            Profiler(name, pid, args.duration + 4, ctx["log_dir"])
            for name, pid in (("server", server.pid), ("router", router.pid))
        ]
        await asyncio.sleep(1.5)
    ready = await loop.run_in_executor(None, publisher.stdout.readline)
    if ready.strip() != "ready":
        raise RuntimeError(f"the publisher did not start: {ready!r}")
    pids = {
        "server": server.pid,
        "router": router.pid,
        "redis": ctx["redis_pid"],
        "bench (clients)": os.getpid(),
        "publisher": publisher.pid,
    }
    quiet_gc()
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    busy_before = machine_busy()
    load_before = os.getloadavg()
    began = time.perf_counter()
    output = await loop.run_in_executor(None, publisher.stdout.read)
    publisher.wait(timeout=30)
    elapsed = time.perf_counter() - began
    cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
    busy_after = machine_busy()
    stats = json.loads(output.strip().splitlines()[-1])
    cpu["publisher"] = stats["cpu_seconds"]  # its own count: it has exited

    expected_per_job: collections.Counter[str] = collections.Counter()
    for i in range(stats["published"]):
        expected_per_job[jobs[i % len(jobs)]] += 1
    expected = sum(expected_per_job[jobs[s % len(jobs)]] for s in range(len(sockets)))

    # Drain: until every expected frame is in, or nothing new for --drain seconds.
    last, still = -1, time.perf_counter()
    while True:
        received = sum(len(f) for f in frames)
        if received >= expected:
            break
        if received != last:
            last, still = received, time.perf_counter()
        elif time.perf_counter() - still > args.drain:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # a late duplicate would still show up
    gc.enable()
    profiles = {p.name: await loop.run_in_executor(None, p.finish) for p in profilers}

    if tap_task:
        tap_task.cancel()
        await tap.aclose()
        await tap_client.aclose()
    closed_codes = collections.Counter(ws.close_code for ws in sockets if ws.close_code is not None)
    still_open = open_count(sockets)
    await close_sockets(sockets)
    for task in readers:
        task.cancel()

    # Every frame: exactly once, in the job's seqs, and its latency.
    warmup_i = int(args.rate * args.warmup)
    latencies: list[float] = []
    duplicates = missing = out_of_order = 0
    unexpected: collections.Counter[str] = collections.Counter()
    per_second = collections.defaultdict(list)
    ws_recv: dict[tuple[str, int], int] = {}  # (job, seq) -> first receive ns over the job's sockets
    for s, sink in enumerate(frames):
        job = jobs[s % len(jobs)]
        seen: collections.Counter[int] = collections.Counter()
        previous = 0
        for received_ns, raw in sink:
            frame = json.loads(raw)
            if frame.get("type") != "event":
                unexpected[frame.get("type", "?")] += 1
                continue
            seq = frame["seq"]
            seen[seq] += 1
            if seq < previous:
                out_of_order += 1
            previous = seq
            if seen[seq] > 1:
                continue
            data = frame["data"]
            latency = (received_ns - data["t"]) / 1e6
            key = (job, seq)
            ws_recv[key] = min(ws_recv.get(key, received_ns), received_ns)
            if data["i"] >= warmup_i:
                latencies.append(latency)
                per_second[data["i"] // args.rate].append(latency)
        duplicates += sum(n - 1 for n in seen.values() if n > 1)
        wanted = set(range(1, expected_per_job[job] + 1))
        missing += len(wanted - set(seen))
        unexpected["seq not published"] += len(set(seen) - wanted)
    received = sum(len(f) for f in frames)

    # The tap: publish -> router PUBLISH (eventbus), and PUBLISH -> frame (gateway).
    to_publish, publish_to_frame = [], []
    for tapped_ns, raw in tapped:
        event = json.loads(raw)
        if event["data"]["i"] < warmup_i:
            continue
        to_publish.append((tapped_ns - event["data"]["t"]) / 1e6)
        first_frame = ws_recv.get((event["job_id"], event["seq"]))
        if first_frame is not None:
            publish_to_frame.append((first_frame - tapped_ns) / 1e6)

    def quantiles(values: list) -> dict:
        return percentiles(values, "p50", "p90", "p99", "p99.9", "max", digits=2) | {"n": len(values)}

    seconds_p99 = sorted(percentile(v, 0.99) for v in per_second.values())
    busy = busy_after[0] - busy_before[0]
    wall = busy_after[1] - busy_before[1]
    ours = sum(cpu.values())
    # On schedule: the rate, and no stall (a stall then a catch-up burst is not 1,000/s).
    kept_up = stats["rate"] >= 0.99 * args.rate and stats["lag_ms"]["p99"] <= 5
    return {
        "run": run,
        "rate": args.rate,
        "profiled": profile,
        "sockets": len(sockets),
        "jobs": len(jobs),
        "channels_subscribed": subscribed,
        "publisher": stats,
        "kept_up": kept_up,
        "expected": expected,
        "received": received,
        "duplicates": duplicates,
        "missing": missing,
        "out_of_order": out_of_order,
        "unexpected": {k: v for k, v in unexpected.items() if v},
        "closed_codes": dict(closed_codes),
        "still_open": still_open,
        "latency_ms": quantiles(latencies),
        "per_second_p99_ms": (
            {
                "min": round(seconds_p99[0], 2),
                "median": round(median(seconds_p99), 2),
                "max": round(seconds_p99[-1], 2),
            }
            if seconds_p99
            else {}
        ),
        "eventbus_ms": quantiles(to_publish) if args.tap else None,
        "gateway_ms": quantiles(publish_to_frame) if args.tap else None,
        "cpu_percent": {name: round(seconds / elapsed * 100, 1) for name, seconds in cpu.items()},
        # Of all the machine's CPUs: what everything used, and what processes not ours used.
        "machine_busy_percent": round(busy / wall * 100, 1) if wall else None,
        "others_percent": round((busy - ours) / wall * 100, 1) if wall else None,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "profiles": profiles,
    }


def print_run(r: dict) -> None:
    lat, pub = r["latency_ms"], r["publisher"]
    tag = " (profiled, not counted)" if r["profiled"] else ""
    print(
        f"  run {r['run'] + 1}{tag}: p50 {lat['p50']} p90 {lat['p90']} p99 {lat['p99']} max {lat['max']} ms; "
        f"frames {r['received']}/{r['expected']}, duplicates {r['duplicates']}, missing {r['missing']}; "
        f"publisher {pub['rate']:.0f}/s, lag p99 {pub['lag_ms']['p99']:.2f} ms "
        f"({'kept up' if r['kept_up'] else 'FELL BEHIND'}); load {r['load_after'][0]}",
        flush=True,
    )
    if r["eventbus_ms"]:
        print(
            f"    split at the router's PUBLISH: eventbus p50 {r['eventbus_ms']['p50']} p99 {r['eventbus_ms']['p99']} ms"
            f"; gateway p50 {r['gateway_ms']['p50']} p99 {r['gateway_ms']['p99']} ms; CPU % {r['cpu_percent']}, "
            f"whole machine {r['machine_busy_percent']}% of {os.cpu_count()} CPUs",
            flush=True,
        )


# --- the run ----------------------------------------------------------------------------------


async def measure(ctx, args) -> dict:
    results: dict = {}
    if args.sockets:
        print(
            f"1. sockets held: opening {args.sockets} over {args.jobs} jobs, "
            f"{args.connect_concurrency} handshakes at a time",
            flush=True,
        )
        results["sockets"] = await hold_sockets(ctx, args)
    print(
        f"2. publish -> frame: {args.latency_sockets} sockets on {args.latency_jobs} jobs, "
        f"{args.rate} events/s for {args.duration:.0f} s, {args.runs} run(s)",
        flush=True,
    )
    runs = []
    for run in range(args.runs):
        runs.append(await latency_run(ctx, args, run, first=args.jobs + run * args.latency_jobs))
        print_run(runs[-1])
    heavy = heavy_args(args)
    if args.heavy_runs:
        print(
            f"   and {heavy.latency_sockets} sockets on {heavy.latency_jobs} jobs at {heavy.rate} events/s, "
            f"{args.heavy_runs} run(s)",
            flush=True,
        )
    for run in range(args.heavy_runs):
        first = args.jobs + (args.runs + 1) * args.latency_jobs + run * heavy.latency_jobs
        runs.append(await latency_run(ctx, heavy, run, first=first))
        print_run(runs[-1])
    results["latency"] = runs
    missed = any(r["latency_ms"]["p99"] > TARGET_P99_MS for r in runs if r["rate"] == args.rate)
    if args.profile == "always" or (args.profile == "auto" and missed):
        print(
            (
                "   latency target missed: one more run with py-spy on the server and the router"
                if missed
                else "   one more run with py-spy on the server and the router"
            ),
            flush=True,
        )
        first = args.jobs + args.runs * args.latency_jobs
        profiled = await latency_run(ctx, args, args.runs, first=first, profile=True)
        print_run(profiled)
        results["profiled"] = profiled
    return results


def heavy_args(args):
    """The arguments of the heavy latency runs: --heavy-rate events/s on --heavy-sockets sockets."""
    return argparse.Namespace(
        **{
            **vars(args),
            "rate": args.heavy_rate,
            "latency_sockets": args.heavy_sockets,
            "latency_jobs": args.heavy_sockets,
        }
    )


def fixture_jobs(args) -> int:
    """Jobs to create: the held sockets', then fresh ones per latency run (the profiled one too)."""
    return args.jobs + args.latency_jobs * (args.runs + 1) + args.heavy_sockets * args.heavy_runs


CONNECTION_BOUND = 10


def per_socket_kib(s: dict) -> float:
    """server's RSS growth from idle to every socket held, per socket held."""
    return (s["rss_held"]["VmRSS"] - s["before"]["rss"]["VmRSS"]) / max(s["held"], 1)


def resync_rows(b: dict, f: dict | None, target_ms: float) -> list[tuple[str, str, str, str]]:
    """The resync after a blip: its p99 on the wall clock, and its server CPU against the plain
    fan-out of the same sockets in the same run (how much of the wait is the resync's, and how
    much the delivery of the frames to clients on the same CPUs)."""
    same = f is not None and f["sockets"] == b["sockets"]
    plain = (
        f"; the plain fan-out's last frame after {f['ms']['max']} ms, so the blip added "
        f"{b['ms']['max'] - f['ms']['max']:.0f} ms"
        if same and f
        else ""
    )
    rows = [
        (
            f"resync of {b['sockets']:,} sockets after a Redis blip: the event published right after",
            f"p99 {b['ms']['p99']} ms (p50 {b['ms']['p50']}, max {b['ms']['max']}); "
            f"{b['received']:,} of {b['sockets']:,} sockets{plain}",
            f"p99 <= {target_ms:g} ms, every socket",
            verdict(b["ms"]["p99"] <= target_ms and b["received"] == b["sockets"]),
        )
    ]
    if same and f and f["server_cpu_ms"]:
        ratio = b["server_cpu_ms"] / f["server_cpu_ms"]
        rows.append(
            (
                f"server CPU of that resync ({b['sockets']:,} sockets) over the plain fan-out's",
                f"{ratio:.2f}x: {b['server_cpu_ms']} ms against {f['server_cpu_ms']} ms; clients' CPU "
                f"{b.get('client_cpu_ms', '-')} ms against {f.get('client_cpu_ms', '-')} ms",
                f"<= {TARGET_RESYNC_CPU_RATIO:g}x",
                verdict(ratio <= TARGET_RESYNC_CPU_RATIO),
            )
        )
    return rows


def verdicts(results: dict, args) -> list[tuple[str, str, str, str]]:
    rows = []
    s = results.get("sockets")
    if s:
        rows.append(
            (
                "open sockets held by one server process",
                f"{s['held']:,} of {s['attempted']:,}"
                + (
                    f" ({args.fd_capped[0]:,} asked; RLIMIT_NOFILE's hard limit here is "
                    f"{args.fd_capped[1]:,}, not raised: no CAP_SYS_RESOURCE)"
                    if getattr(args, "fd_capped", None)
                    else ""
                ),
                f">= {TARGET_SOCKETS:,}",
                verdict(s["held"] >= TARGET_SOCKETS),
            )
        )
        points = s["checkpoints"]
        server = [p["redis"]["by_owner"].get("server", {"all": 0, "pubsub": 0}) for p in points]
        rows.append(
            (
                "Redis pub/sub connections of the server",
                ", ".join(f"{d['pubsub']} at {p['sockets']:,}" for d, p in zip(server, points)) + " sockets",
                "1 (one shared per process)",
                verdict(all(d["pubsub"] == 1 for d in server)),
            )
        )
        series = ", ".join(f"{d['all']} at {p['sockets']:,}" for d, p in zip(server, points)) + " sockets"
        blips = [s[name] for name in ("blip", "blip_all") if s.get(name)]
        for b in blips:
            series += f"; {b['peak_server']} in the resync of {b['probe']['sockets']:,} after a Redis blip"
        # O(1): one bound whatever the sockets, blip included: the hub's pub/sub connection,
        # its read pool (GATEWAY READ_CONNECTIONS, default 8) and one spare.
        peaks = [d["all"] for d in server] + [b["peak_server"] for b in blips]
        constant = max(peaks) <= CONNECTION_BOUND
        rows.append(
            (
                "Redis connections of the server, all (pub/sub + history reads)",
                series,
                f"O(1) in sockets: <= {CONNECTION_BOUND} at every count",
                verdict(constant),
            )
        )
        kib = per_socket_kib(s)
        rows.append(
            (
                "the server's memory per socket (RSS held - idle, over the sockets held)",
                f"{kib:.1f} KiB at {s['held']:,} sockets",
                f"<= {TARGET_KIB_PER_SOCKET:g} KiB",
                verdict(kib <= TARGET_KIB_PER_SOCKET),
            )
        )
        if s.get("fanout"):
            f = s["fanout"]
            rows.append(
                (
                    f"fan-out: one event to each of {s['jobs']:,} jobs, {f['sockets']:,} sockets "
                    f"(median of {len(f['rounds'])} rounds), frames per CPU-second of the server process",
                    f"{f['frames_per_cpu_s']:,} frames per CPU-second ({f['server_cpu_ms']} ms of CPU a round); "
                    f"wall clock {f['frames_per_s']:,} frames/s, the last frame after {f['ms']['max']} ms, "
                    "with the clients on the same 2 CPUs",
                    f">= {TARGET_FANOUT:,} frames/s per process",
                    verdict(f["frames_per_cpu_s"] >= TARGET_FANOUT and f["received"] == f["sockets"])
                    + (
                        ""
                        if f["sockets"] == PROBE_SOCKETS
                        else f" (at {f['sockets']:,} sockets, not {PROBE_SOCKETS:,})"
                    ),
                )
            )
        if s.get("blip"):
            rows += resync_rows(s["blip"]["probe"], s.get("fanout"), TARGET_RESYNC_P99_MS)
        if s.get("blip_all"):
            rows += resync_rows(s["blip_all"]["probe"], s.get("fanout_all"), TARGET_RESYNC_ALL_P99_MS)
    for r in results["latency"]:
        lat = r["latency_ms"]
        heavy = r["rate"] >= TARGET_HEAVY_RATE
        target = TARGET_HEAVY_P99_MS if heavy else TARGET_P99_MS
        on_target = (r["rate"], r["sockets"]) in (
            (TARGET_RATE, TARGET_LATENCY_SOCKETS),
            (TARGET_HEAVY_RATE, TARGET_HEAVY_SOCKETS),
        )
        rows.append(
            (
                f"publish -> frame p99, run {r['run'] + 1} ({r['sockets']} sockets, "
                f"{r['publisher']['rate']:.0f} ev/s)",
                f"{lat['p99']} ms (p50 {lat['p50']}, max {lat['max']})",
                f"<= {target:g} ms",
                verdict(lat["p99"] <= target)
                + ("" if r["kept_up"] else " (the publisher stalled)")
                + ("" if on_target else " (not the target's rate and sockets)"),
            )
        )
    lost = sum(r["missing"] for r in results["latency"])
    dup = sum(r["duplicates"] for r in results["latency"])
    received = sum(r["received"] for r in results["latency"])
    expected = sum(r["expected"] for r in results["latency"])
    rows.append(
        (
            "every frame exactly once (all runs)",
            f"{received:,}/{expected:,}; duplicates {dup}, missing {lost}",
            "0 duplicates, 0 missing",
            verdict(not lost and not dup and received == expected),
        )
    )
    kept = all(r["kept_up"] for r in results["latency"])
    rows.append(
        (
            "publisher kept the schedule (rate; lag behind it, p99)",
            ", ".join(
                f"{r['publisher']['rate']:.0f}/s, {r['publisher']['lag_ms']['p99']:.1f} ms"
                for r in results["latency"]
            ),
            "the rate asked, lag p99 <= 5 ms",
            (
                "yes"
                if kept
                else "NO in run(s) "
                + ", ".join(str(r["run"] + 1) for r in results["latency"] if not r["kept_up"])
                + ": stalled by the machine, then caught up in a burst"
            ),
        )
    )
    return rows


def render(results: dict, args, info: dict) -> str:
    rows = verdicts(results, args)
    out = [
        f"Run of {info['when']}, command: `{info['command']}`",
        "",
        f"Machine: {info['nproc']} CPUs ({info['cpu']}), shared; Python {info['python']}, Django {info['django']}, "
        f"{info['server_name']}, daphne {info['daphne']}, uvicorn {info['uvicorn']}, channels {info['channels']}, redis-py {info['redis_py']}, websockets "
        f"{info['websockets']}; Redis {info['redis']}; {info['database']}. Load average (1 min) "
        f"{info['load_start']:.2f} at the start, {info['load_end']:.2f} at the end; duration "
        f"{info['seconds']:.0f} s.",
        "",
        *markdown_table(("target", "measured", "target", "verdict"), "llll", rows),
    ]
    s = results.get("sockets")
    if s:
        out += [
            "",
            "### 1. Sockets held",
            "",
            f"{s['attempted']:,} sockets over {s['jobs']:,} jobs, {s['concurrency']} handshakes in flight; "
            f"all opened in {s['connect_seconds']} s; handshake p50 {s['handshake_ms']['p50']} ms, "
            f"p99 {s['handshake_ms']['p99']} ms, max {s['handshake_ms']['max']} ms; held {s['held']:,} after "
            f"{s['held_after_seconds']:.0f} s more; failures: {s['failures'] or 'none'}; closed: "
            f"{s['closed_codes'] or 'none'}.",
            "",
            "| sockets open | step time s | server RSS MiB (peak) | server fds | job channels "
            "(subscribers each) | Redis connections: all / pubsub | of which server: all / pubsub | others |",
            "|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        before = s["before"]
        d = before["redis"]["by_owner"].get("server", {"all": 0, "pubsub": 0})
        others = ", ".join(f"{k} {v['all']}" for k, v in before["redis"]["by_owner"].items() if k != "server")
        out.append(
            f"| 0 (idle) | | {before['rss']['VmRSS'] / 1024:.1f} ({before['rss']['VmHWM'] / 1024:.1f}) | | 0 | "
            f"{before['redis']['total']} / {before['redis']['pubsub']} | {d['all']} / {d['pubsub']} | {others} |"
        )
        for p in s["checkpoints"]:
            d = p["redis"]["by_owner"].get("server", {"all": 0, "pubsub": 0})
            others = ", ".join(f"{k} {v['all']}" for k, v in p["redis"]["by_owner"].items() if k != "server")
            out.append(
                f"| {p['open']:,} | {p['seconds']} | {p['rss']['VmRSS'] / 1024:.1f} "
                f"({p['rss']['VmHWM'] / 1024:.1f}) | {p['server_fds']:,} | {p['channels']:,} "
                f"({p['max_subscribers_per_channel']}) | {p['redis']['total']} / {p['redis']['pubsub']} | "
                f"{d['all']} / {d['pubsub']} | {others} |"
            )
        a = s["after_close"]
        d = a["redis"]["by_owner"].get("server", {"all": 0, "pubsub": 0})
        out.append(
            f"| 0 (all closed) | | {a['rss']['VmRSS'] / 1024:.1f} ({a['rss']['VmHWM'] / 1024:.1f}) | | "
            f"{a['channels']} | {a['redis']['total']} / {a['redis']['pubsub']} | {d['all']} / {d['pubsub']} | |"
        )
        out += [
            "",
            f"server RSS {before['rss']['VmRSS'] / 1024:.1f} MiB idle -> {s['rss_held']['VmRSS'] / 1024:.1f} MiB "
            f"with {s['held']:,} sockets: {per_socket_kib(s):.1f} KiB per socket. Channels "
            f"unsubscribed {a['unsubscribed_in']} s after the last close.",
        ]
        for name in ("fanout", "fanout_all"):
            f = s.get(name)
            if f:
                rounds = ", ".join(f"{r['frames_per_s']:,}" for r in f["rounds"])
                out += [
                    "",
                    f"Fan-out with {f['sockets']:,} sockets held: one event published to each of the "
                    f"{s['jobs']:,} jobs in one `publish_events` call, {len(f['rounds'])} rounds (frames/s: "
                    f"{rounds}); the median round reached {f['received']:,} of {f['sockets']:,} sockets, frame "
                    f"after publish p50 {f['ms']['p50']} ms, p99 {f['ms']['p99']} ms, max {f['ms']['max']} ms; "
                    f"server used {f['server_cpu_ms']} ms of CPU ({f['frames_per_cpu_s']:,} frames per "
                    f"CPU-second; the clients ({f.get('client_cpu_ms', '-')} ms of CPU), Redis and the router "
                    "share the machine's 2 CPUs with it).",
                ]
        for b in (s[name] for name in ("blip", "blip_all") if s.get(name)):
            out += [
                "",
                f"Redis blip with {b['probe']['sockets']:,} sockets held (`CLIENT KILL TYPE pubsub`: the hub's "
                f"connection, {b['killed']} killed): every job channel subscribed again in "
                f"{b['resubscribed_in']} s; the server's Redis connections {b['server_before']} before, peak "
                f"{b['peak_server']}, {b['server_after']} after (every socket resyncs; the sockets of a job share one history read, and one database query answers many jobs' states); "
                f"sockets still open {b['still_open']:,}; server RSS {b['rss']['VmRSS'] / 1024:.1f} MiB. "
                f"An event published to every job right after the kill reached {b['probe']['received']:,} "
                f"of {b['probe']['sockets']:,} sockets: p50 {b['probe']['ms']['p50']} ms, p99 "
                f"{b['probe']['ms']['p99']} ms, max {b['probe']['ms']['max']} ms after publish.",
            ]
    out += [
        "",
        "### 2. Publish -> frame latency",
        "",
        f"{args.latency_sockets} sockets on {args.latency_jobs} jobs (fresh per run) at {args.rate} events/s, "
        f"and {args.heavy_runs} run(s) of {args.heavy_sockets} sockets on as many jobs at {args.heavy_rate} "
        f"events/s, for {args.duration:.0f} s each, published in a process of its own (`publish_event`; above "
        "1,000 events/s one `publish_events` batch a millisecond), round robin over the jobs; the first "
        f"{args.warmup:.0f} s are warm-up (checked for exactly-once, left out of the percentiles). ms, "
        f"receive time (client) - publish time (`time.time_ns()` in the event's data).",
        "",
        "| run | p50 | p90 | p99 | p99.9 | max | p99 of the worst second | frames received / expected | dup | "
        "missing | publisher rate, lag p99 / max ms | eventbus p50 / p99 | gateway p50 / p99 | "
        "CPU %: server, router, redis, clients, publisher | machine busy %, others % | load 1 min |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---|---|",
    ]
    every = results["latency"] + ([results["profiled"]] if results.get("profiled") else [])
    for r in every:
        lat, pub, cpu = r["latency_ms"], r["publisher"], r["cpu_percent"]
        eb = f"{r['eventbus_ms']['p50']} / {r['eventbus_ms']['p99']}" if r["eventbus_ms"] else "-"
        gw = f"{r['gateway_ms']['p50']} / {r['gateway_ms']['p99']}" if r["gateway_ms"] else "-"
        name = f"{r['run'] + 1}: {r['rate']:,}/s, {r['sockets']:,} sockets" + (
            " (py-spy, not counted)" if r["profiled"] else ""
        )
        out.append(
            f"| {name} | {lat['p50']} | {lat['p90']} | {lat['p99']} | {lat['p99.9']} | {lat['max']} | "
            f"{r['per_second_p99_ms'].get('max', '-')} | {r['received']:,} / {r['expected']:,} | {r['duplicates']} | "
            f"{r['missing']} | {pub['rate']:.0f}/s, {pub['lag_ms']['p99']:.2f} / {pub['lag_ms']['max']:.1f} | {eb} | {gw} | "
            f"{cpu['server']}, {cpu['router']}, {cpu['redis']}, {cpu['bench (clients)']}, {cpu['publisher']} | "
            f"{r['machine_busy_percent']}, {r['others_percent']} | {r['load_before'][0]} -> {r['load_after'][0]} |"
        )
    problems = [r for r in every if r["unexpected"] or r["closed_codes"] or r["out_of_order"]]
    for r in problems:
        out.append(
            f"\nRun {r['run'] + 1}: unexpected frames {r['unexpected']}, closes {r['closed_codes']}, "
            f"out of order {r['out_of_order']}."
        )
    profiled = results.get("profiled")
    if profiled and profiled["profiles"]:
        out += ["", "### py-spy (the profiled run)", ""]
        for name, prof in profiled["profiles"].items():
            out += profile_table(name, prof, args.duration + 4)
    held = results.get("sockets") or {}
    for title, probe_result in (
        ("the fan-out rounds", held.get("fanout") or {}),
        ("the Redis blip and the resync", (held.get("blip") or {}).get("probe") or {}),
    ):
        if probe_result.get("profile"):
            out += ["", f"### py-spy on the server during {title}", ""]
            out += profile_table("server", probe_result["profile"], probe_result["profile"]["seconds"])
    return "\n".join(out)


def profile_table(name: str, prof: dict, seconds: float) -> list[str]:
    if "error" in prof:
        return [f"{name}: {prof['error']}"]
    out = [
        f"**{name}**: {prof['samples']} working samples ({prof['waiting_samples']} more waiting in "
        f"select or on a Redis reply) at {prof.get('rate', Profiler.RATE)} Hz over {seconds:.0f} s; shares "
        f"of the working samples.",
        "",
        "| self | frame |  | inclusive | frame |",
        "|---:|---|---|---:|---|",
    ]
    inclusive = [f for f in prof["inclusive"] if f[1] < 0.999][:15]
    for i in range(max(len(prof["self"]), len(inclusive))):
        a = prof["self"][i] if i < len(prof["self"]) else ("", None)
        b = inclusive[i] if i < len(inclusive) else ("", None)
        out.append(
            f"| {'' if a[1] is None else f'{a[1]:.1%}'} | `{a[0]}` | | "
            f"{'' if b[1] is None else f'{b[1]:.1%}'} | `{b[0]}` |"
        )
    return [*out, ""]


def write_report(text: str) -> None:
    write_section(REPORT, text, BEGIN, END, "# Gateway benchmark\n\n## Results")


def raise_fd_limit(needed: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        try:  # root may raise the hard limit too (up to fs.nr_open)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, needed))
            hard = needed
        except (ValueError, OSError):
            pass
    if soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(max(needed, soft), hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sockets", type=int, default=TARGET_SOCKETS, help="sockets to hold (0: skip)")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs the held sockets spread over")
    parser.add_argument("--connect-concurrency", type=int, default=50, help="handshakes in flight")
    parser.add_argument("--hold", type=float, default=5.0, help="seconds to hold the sockets before counting")
    parser.add_argument("--latency-sockets", type=int, default=TARGET_LATENCY_SOCKETS)
    parser.add_argument("--latency-jobs", type=int, default=TARGET_LATENCY_SOCKETS)
    parser.add_argument("--rate", type=int, default=TARGET_RATE, help="events/s published")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of publishing per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds left out of the percentiles")
    parser.add_argument(
        "--drain", type=float, default=5.0, help="seconds without a new frame before giving up"
    )
    parser.add_argument("--runs", type=int, default=3, help="latency runs")
    parser.add_argument(
        "--heavy-rate", type=int, default=TARGET_HEAVY_RATE, help="events/s of the heavy runs"
    )
    parser.add_argument(
        "--heavy-sockets", type=int, default=TARGET_HEAVY_SOCKETS, help="sockets (and jobs) of the heavy runs"
    )
    parser.add_argument("--heavy-runs", type=int, default=1, help="latency runs at --heavy-rate (0: none)")
    parser.add_argument(
        "--fanout-rounds", type=int, default=5, help="fan-out probes (one event to every job each; 0: none)"
    )
    parser.add_argument(
        "--no-blip",
        dest="blip",
        action="store_false",
        help="no CLIENT KILL of the hub's pub/sub connection while the sockets are held",
    )
    parser.add_argument(
        "--no-tap",
        dest="tap",
        action="store_false",
        help="no pattern subscription timing the router's PUBLISH",
    )
    parser.add_argument(
        "--profile",
        choices=("auto", "always", "never"),
        default="auto",
        help="one more run under py-spy: when the latency target is missed (auto)",
    )
    parser.add_argument(
        "--server",
        choices=("uvicorn", "uvicorn-sansio", "daphne", "uvicorn-legacy"),
        default="uvicorn",
        help="The gateway's ASGI server: uvicorn as the Procfile runs it (gateway.uvicorn's protocol, "
        "no per-message deflate), uvicorn with its own websockets-sansio protocol and defaults, daphne, "
        "or uvicorn with its legacy websockets protocol.",
    )
    parser.add_argument(
        "--profile-probes",
        action="store_true",
        help="py-spy on the server during the fan-out rounds and the Redis blip (at 5,000 sockets)",
    )
    parser.add_argument(
        "--no-deflate",
        dest="deflate",
        action="store_false",
        help="the clients do not offer permessage-deflate (browsers do; the server accepts it unless it "
        "runs with --ws-per-message-deflate false, as the Procfile's uvicorn does)",
    )
    parser.add_argument(
        "--server-option",
        action="append",
        default=[],
        help="one more option for the server's command line (repeat it), e.g. "
        "--server-option=--ws-per-message-deflate=false",
    )
    parser.add_argument(
        "--client",
        choices=("light", "websockets"),
        default="light",
        help="the held sockets' client: bench.ws_light's protocol (no task per socket), or the "
        "websockets library's (as the latency runs use)",
    )
    parser.add_argument("--no-report", action="store_true")
    parser.add_argument("--publisher", help=argparse.SUPPRESS)  # internal: the publisher process
    args = parser.parse_args()
    if args.publisher:
        return publisher_main(args)

    started, load_start = time.time(), os.getloadavg()[0]
    limit = raise_fd_limit(args.sockets + 1024)  # server inherits it
    args.fd_capped = None
    if limit < args.sockets + 256:
        # The hard limit needs CAP_SYS_RESOURCE to be raised (a container's root may lack it).
        print(f"RLIMIT_NOFILE is {limit}: holding at most {limit - 256} sockets", file=sys.stderr)
        args.fd_capped = (args.sockets, limit)
        args.sockets = max(0, limit - 256)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    redis_server = database = None
    children: list[Process] = []
    ctx: dict = {"publishers": [], "log_dir": log_dir, "profile_probes": args.profile_probes}

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        redis_server = RedisServer().start()
        database = BenchDatabase(f"bench_gateway_{os.getpid()}")
        database.create()
        env = bench_env(redis_server.url, database.url)
        os.environ.update(env)
        setup_django()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        session_key, jobs = create_fixtures(fixture_jobs(args))
        from django.db import connections

        connections.close_all()

        import redis

        client = redis.Redis.from_url(redis_server.url, client_name="bench")
        port = free_port()
        server_args = server_command(args.server, port, args.server_option)
        server = Process(*server_args, name="server", environ=env, log_dir=log_dir).start()
        children.append(server)
        router = Process(
            sys.executable, "manage.py", "run_router", name="router", environ=env, log_dir=log_dir
        )
        children.append(router.start())
        wait_port(server, port)
        wait_router(router, client)
        print(
            f"server pid {server.pid} on :{port}, router pid {router.pid}, Redis :{redis_server.port}, "
            f"{database.version}; logs in {log_dir}; RLIMIT_NOFILE {limit}",
            flush=True,
        )

        def owners() -> dict[str, int]:
            found = {"server": server.pid, "router": router.pid, "bench": os.getpid()}
            found.update({f"publisher-{i}": p.pid for i, p in enumerate(ctx["publishers"]) if p.alive()})
            return found

        ctx.update(
            client=client,
            target=Target(port, session_key, args.deflate, light=args.client == "light"),
            jobs=jobs,
            server=server,
            router=router,
            owners=owners,
            env=env,
            redis_url=redis_server.url,
            redis_pid=redis_server.process.pid,  # type: ignore[union-attr]  # started
        )
        results = asyncio.run(measure(ctx, args))
        for child in children:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited during the bench:\n{child.log(tail=3000)}")
        server_log = server.log().splitlines()
        errors = [line for line in server_log if "Traceback" in line or " ERROR " in line]
        results["server_errors"] = errors[:20]
        # Backfills refused by the hub's connection pool (redis-py's MaxConnectionsError is a
        # ConnectionError: the consumer logs it and retries).
        results["server_warnings"] = {
            "history unreadable (backfill retried)": sum("history unreadable" in line for line in server_log),
            "of which Too many connections": sum(
                "history unreadable" in line and "Too many connections" in line for line in server_log
            ),
            "hub reconnected": sum("gateway hub reconnected" in line for line in server_log),
            "fell behind (4008)": sum("fell" in line and "behind" in line for line in server_log),
        }
        example = next((line for line in server_log if "history unreadable" in line), None)
        if example:
            results["server_warnings"]["example"] = example[:300]
        redis_version = client.info("server")["redis_version"]
    finally:
        for publisher in ctx["publishers"]:
            publisher.kill()
        for child in reversed(children):
            child.stop(timeout=20)
        if redis_server:
            redis_server.stop()
        if database:
            database.drop()

    import channels
    import daphne as daphne_pkg
    import uvicorn
    import websockets

    info = {
        **run_info("bench/gateway.py"),
        "server_name": SERVER_NAMES[args.server],
        "daphne": daphne_pkg.__version__,
        "uvicorn": uvicorn.__version__,
        "channels": channels.__version__,
        "websockets": websockets.__version__,
        "redis": redis_version,
        "database": database.version,
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "seconds": time.time() - started,
    }
    text = render(results, args, info)
    text += f"\n\nThe server's log, whole run: {results['server_warnings']}"
    if results["server_errors"]:
        text += "\n\nThe server logged errors:\n\n```\n" + "\n".join(results["server_errors"]) + "\n```"
    print()
    print(text)
    RESULTS_DIR.mkdir(exist_ok=True)
    raw = RESULTS_DIR / f"gateway-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    raw.write_text(json.dumps({"info": info, "args": vars(args), "results": results}, indent=1, default=str))
    if not args.no_report:
        write_report(text)
        print(f"\nwritten to {REPORT} (raw figures: {raw})")
    failed = results.get("sockets", {}).get("failures")
    if results["server_errors"] or failed:
        print(f"server logged errors or handshakes failed: the logs are kept in {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
