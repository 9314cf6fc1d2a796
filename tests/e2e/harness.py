"""A Jepsen-style harness: the whole stack as real processes, a workload of retried POSTs and
reconnecting WebSocket watchers, faults injected at random, and a checker that proves (or
refutes) exactly-once from the HTTP request to the browser.

    result = run_chaos(ChaosConfig(jobs=200, clients=20, duration=300))
    print(result.report)      # the checker's figures and every failure it found
    assert result.ok

Stack: a private Redis (or a 3-master Redis Cluster for the event bus plus a plain private Redis
for Celery's broker and the cache, or a Sentinel-managed master and replica), 2 web servers,
2 Celery workers, 2 routers, 1 reclaimer with a short
--min-idle-ms, the sweeper; all against the database Django is configured with in this process
(the test database under pytest, a private one under `python -m tests.e2e.chaos`).

Workload: `clients` users, each with a DRF token (HTTP) and a session from /accounts/login/
(WebSocket). Each key is a job POSTed to /api/jobs/ or, for a share of the keys (`task_share`),
a django.tasks task POSTed to the demo's /demo/tasks/ (config.tasks.record_visit, run by
eventbus.backends.ExactlyOnceBackend), some of them delayed 1-5 s (run_after: the sweeper sends
them when due), and for another share (`durable_share`) a job of durable stages, durable_chaos
(tests/e2e/durable.py: an atomic stage's ledger lines, a sleep, a wait for the signal `approve`,
which its client sends through POST /api/jobs/<id>/signals/approve/, and two children; the
sweeper sends its due resumptions). Each key is POSTed 1-3 times, the copies either at the same
moment or one after the other; a 409 (in flight) is retried until it resolves. Each job or task is watched by 1-3
WebSocket clients that disconnect at random (clean close or a dropped TCP connection) and resume
with ?last_seq= of the last event they got.

Faults: a router SIGKILLed every few seconds and restarted (alternately under its old consumer
name, whose pending entries it recovers itself, and a new one, whose entries the reclaimer
claims); a Celery worker SIGKILLed (whole process group) mid-job and restarted; a worker's
prefork pool processes SIGKILLed mid-job (WorkerLostError: the task is requeued); CLIENT KILL
TYPE normal, then TYPE pubsub, on every Redis server; the plain Redis SIGKILLed and started
again from its append-only file (appendfsync always: nothing acknowledged is lost), with the
broker, the cache and (unless clustered) the bus on it; the workers' network to Redis (a TCP
proxy of the harness's, tests/e2e/proxy.py) stalled for seconds, then every connection reset.
With `sentinel`, everything Redis is a Sentinel-managed master and its replica, and a SENTINEL
FAILOVER happens under load; on the cluster, each master has a replica and a CLUSTER FAILOVER of
a master happens under load (the gateway hub follows its channels to the new master). On PostgreSQL, a web server's session is killed mid-request
(pg_terminate_backend) with every session of the workers and the sweeper: the client gets a 503
and retries it.

Checker (see `Checker`): one job row and one completion per key, identical responses to
retries, each (job, stage, seq) once in the streams, state = final event, history complete,
nothing pending, no dead letter, each watcher saw the job's full seq list in order with no
duplicate, gap or reset; for the tasks, the task's job keyed from the request's key, SUCCESSFUL
with its return value, a delayed one started no earlier than its run_after; for the durable
jobs, their ledger lines exactly once, one signal delivered, exactly two children, each COMPLETED
once with its events once in the streams, no job of the run left unfinished; plus the counts of
what each layer dropped and what was killed.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import random
import re
import signal
import threading
import time
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any

import redis

from config.redis_server import RedisClusterServers, RedisServer, free_port
from eventbus.redis.sentinel import parse_sentinel_url
from tests.processes import Manage, Process, Web, Worker, alive, child_pids, restart, wait_for
from tests.sentinels import SentinelGroup

from . import durable
from .jobtypes import DURABLE, durable_seqs
from .proxy import StallingProxy

log = logging.getLogger("chaos")

TASKS_PATH = "/demo/tasks/"
TASK_PATH = "config.tasks.record_visit"
WEB_APP = "chaos-web"  # the application_name of the web servers' PostgreSQL sessions
UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
THROTTLED_DETAILS_WAIT = 60.0  # the jobs throttle's window: a minute


# Configuration ------------------------------------------------------------------------------


@dataclass
class ChaosConfig:
    jobs: int = 200
    clients: int = 20
    duration: float = 300.0  # seconds over which the jobs are posted; the faults run as long
    seed: int | None = None
    cluster: bool = False
    stage_seconds: float = 0.4  # simulated work per stage: a scan job runs ~1.6 s
    max_copies: int = 3  # each POST is sent 1..max_copies times with the same key
    max_watchers: int = 3  # each job is watched by 1..max_watchers WebSocket clients
    task_share: float = 0.25  # of the keys: a django.tasks task (POST /demo/tasks/), not a job
    delayed_task_share: float = 0.5  # of the tasks: started 1-5 s after the POST (run_after)
    durable_share: float = 0.2  # of the keys: a durable_chaos job (tests/e2e/durable.py), not scan/chat
    durable_crash_share: float = 0.5  # of those: the atomic stage's first process dies after its writes
    early_signal_share: float = 0.25  # of those: the signal sent at once, before the job waits for it
    signal_replay_share: float = 0.5  # of those: the signal sent again under its key (202, a replay)
    signal_rival_share: float = 0.5  # of those: the signal sent under another key too (409)
    router_kill_every: tuple[float, float] = (3.0, 6.0)
    worker_kills: int = 2  # a whole worker SIGKILLed mid-job, then restarted
    pool_kills: int = 1  # a worker's pool processes SIGKILLed mid-job
    daphne_kills: int = 1  # one of the two web servers SIGKILLed mid-stream, then restarted
    redis_restarts: int = 1  # the plain Redis SIGKILLed and started again from its AOF (plain runs)
    network_stalls: int = 1  # the workers' link to Redis stalled, then reset (plain runs)
    sentinel: bool = False  # Redis as a Sentinel-managed master and its replica (3 sentinels)
    failovers: int = 1  # SENTINEL FAILOVER, or CLUSTER FAILOVER of a master, under load
    backend_kills: int = 1  # PostgreSQL backends killed mid-request (PostgreSQL runs)
    worker_concurrency: int = 2
    min_idle_ms: int = 1000  # the reclaimer's --min-idle-ms
    reclaim_interval: float = 0.5
    visibility_timeout: int = 12  # Celery's: a killed worker's task is delivered again after it
    settle_timeout: float = 120.0  # after the last POST: time left for everything to finish
    progress: bool = True  # log progress lines (logger "chaos")

    @classmethod
    def short(cls, **overrides) -> ChaosConfig:
        """The run `make test` makes: every fault kind at least once, in well under 3 minutes."""
        values: dict[str, Any] = dict(
            jobs=48,
            clients=8,
            duration=30.0,
            worker_kills=1,
            pool_kills=1,
            settle_timeout=75.0,
            router_kill_every=(2.5, 4.5),
        )
        values.update(overrides)
        return cls(**values)


# Redis ---------------------------------------------------------------------------------------


class Topology:
    """The run's private Redis servers. Plain: one server for everything. Cluster: a 3-master
    cluster for the event bus (a replica per master when it is failed over), and a plain server
    for Celery's broker and the cache."""

    def __init__(self, *, cluster: bool, rng: random.Random, sentinel: bool = False, replicas: int = 0):
        self.cluster = cluster
        self.rng = rng
        self.cluster_servers = RedisClusterServers(3, replicas=replicas, rng=rng)
        self.plain: RedisServer | None = None
        self.sentinels: SentinelGroup | None = None
        self.sentinel = sentinel

    def start(self) -> Topology:
        try:
            # A durable store, every write in the AOF before it is acknowledged: a SIGKILL then
            # loses nothing acknowledged (losing recent writes is tests/gateway/test_redis_restarts.py).
            if self.sentinel:
                # Everything (broker, cache, bus) on the master the sentinels name; a failover
                # may lose what the replica had not yet received.
                self.sentinels = SentinelGroup(durable=True, args=("--appendfsync", "always")).start()
            else:
                self.plain = RedisServer(durable=True, args=("--appendfsync", "always")).start()
            if self.cluster:
                self.cluster_servers.start()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def nodes(self) -> list[RedisServer]:
        return self.cluster_servers.nodes

    def stop(self) -> None:
        self.cluster_servers.stop()
        if self.plain is not None:
            self.plain.stop()
        if self.sentinels is not None:
            self.sentinels.stop()

    @property
    def broker(self) -> RedisServer:
        """The plain server (Celery's broker, the cache; the bus too unless clustered)."""
        assert self.plain is not None, "the topology is not started"
        return self.plain

    @property
    def servers(self) -> list[RedisServer]:
        if self.sentinels is not None:
            return self.sentinels.servers
        return [*self.cluster_servers.servers, self.broker]

    @property
    def broker_url(self) -> str:
        return self.sentinels.url if self.sentinels is not None else self.broker.url

    @property
    def bus_url(self) -> str:
        return self.nodes[0].url if self.cluster else self.broker_url

    @property
    def env(self) -> dict[str, str]:
        return {
            "REDIS_URL": self.bus_url,
            "CELERY_BROKER_URL": self.broker_url,
            "CACHE_URL": self.broker_url,
            "EVENTBUS_CLUSTER": "1" if self.cluster else "",
        }

    def bus(self):
        if self.cluster:
            from redis.cluster import RedisCluster

            return RedisCluster.from_url(self.bus_url, decode_responses=True)
        sentinel_url = parse_sentinel_url(self.bus_url)
        if sentinel_url is not None:
            from redis.sentinel import Sentinel

            return sentinel_url.master_for(Sentinel, redis.Redis, decode_responses=True, socket_timeout=5)
        return redis.Redis.from_url(self.bus_url, decode_responses=True)

    def job_channels_listened(self) -> bool:
        """Whether a gateway hub listens to a job's channel: classic channels on the (current)
        master, or on a cluster a shard channel on any master (SSUBSCRIBE)."""
        if self.cluster:
            ports, command = [node.port for node in self.cluster_servers.servers], "PUBSUB SHARDCHANNELS"
        else:
            port = self.sentinels.master_port() if self.sentinels is not None else self.broker.port
            ports, command = [port], "PUBSUB CHANNELS"
        for port in ports:
            with redis.Redis(port=port, socket_timeout=5) as client:
                if any(b":channel:" in channel for channel in client.execute_command(command)):
                    return True
        return False

    def restart_plain(self, pause: float) -> None:
        """SIGKILL the plain server (broker, cache, and the bus unless clustered) and start it
        again, on its port and its AOF, after `pause` seconds."""
        self.broker.kill()
        time.sleep(pause)
        self.broker.start()

    def client_kill(self, kind: str) -> int:
        """CLIENT KILL TYPE <kind> on every server; how many connections were killed."""
        killed = 0
        for server in self.servers:
            with redis.Redis(port=server.port, socket_timeout=5) as client:
                killed += int(client.client_kill_filter(_type=kind, skipme=True))
        return killed


# Processes -----------------------------------------------------------------------------------


class Stack:
    """daphne, 2 Celery workers, 2 routers, the reclaimer and the sweeper, as real processes."""

    def __init__(self, topology: Topology, config: ChaosConfig, *, workers_redis: str | None = None):
        self.config = config
        self.env = {
            **topology.env,
            "EVENTBUS_STAGE_SECONDS": str(config.stage_seconds),
            "EVENTBUS_RECOVER_AFTER": "15",  # a job whose run died with Redis is sent again soon
            # A POST in flight when its daphne is killed holds its key until the lease expires
            # (on SQLite the lease commits before the view runs): well within a client's 60 s.
            "IDEMPOTENCY_LEASE_SECONDS": "15",
            "CELERY_VISIBILITY_TIMEOUT": str(config.visibility_timeout),
            "LOG_LEVEL": "INFO",
        }
        # Two web servers: clients pick one at random for each request and connection, so the
        # watchers of a killed one resume on the other.
        self.ports = [free_port(), free_port()]
        self.port = self.ports[0]
        # Each kind of process names its PostgreSQL sessions (libpq's PGAPPNAME), for the faults.
        self.webs = [Web(port, **self.env, PGAPPNAME=WEB_APP) for port in self.ports]
        # The workers reach Redis through the harness's proxy when the network is to stall.
        worker_env = dict(self.env)
        if workers_redis:
            worker_env.update(
                REDIS_URL=workers_redis, CELERY_BROKER_URL=workers_redis, CACHE_URL=workers_redis
            )
        self.workers = [
            Worker(
                f"chaos-w{i}", concurrency=config.worker_concurrency, **worker_env, PGAPPNAME="chaos-worker"
            )
            for i in (1, 2)
        ]
        self.worker_log_start = {worker.name: 0 for worker in self.workers}  # log offset of the live run
        self.routers: list[Manage] = []  # the live incarnation of each router slot
        self.all_routers: list[Manage] = []  # every incarnation, for their logs
        self.metrics_ports: dict[int, int] = {}  # id(process) -> its --metrics-port
        self.consumer_names: dict[int, str] = {}
        self.reclaimer = self._managed(
            "run_reclaimer",
            "--min-idle-ms",
            str(config.min_idle_ms),
            "--interval",
            str(config.reclaim_interval),
        )
        self.sweeper = Manage(
            "sweep_jobs", "--interval", "2", "--older-than", "5", **self.env, PGAPPNAME="chaos-sweeper"
        )
        self._incarnations = 0

    def _managed(self, *args: str) -> Manage:
        port = free_port()
        process = Manage(*args, "--metrics-port", str(port), **self.env, PGAPPNAME=f"chaos-{args[0]}")
        self.metrics_ports[id(process)] = port
        return process

    def _new_router(self, consumer: str) -> Manage:
        router = self._managed("run_router", "--consumer", consumer, "--block-ms", "200")
        self.consumer_names[id(router)] = consumer
        self.all_routers.append(router)
        return router

    @property
    def web(self) -> Web:
        return self.webs[0]

    def web_logs(self) -> str:
        return "".join(web.log() for web in self.webs)

    @property
    def live(self) -> list[Process]:
        """The processes that should be running now (the current incarnation of each)."""
        return [*self.webs, *self.workers, *self.routers, self.reclaimer, self.sweeper]

    @property
    def metered(self) -> list[Process]:
        return [self.reclaimer, *self.all_routers]

    def start(self) -> None:
        self.routers = [self._new_router(f"chaos-router-{slot}") for slot in (0, 1)]
        for process in (*self.routers, self.reclaimer, self.sweeper):
            process.start()
        # The workers and the web servers take seconds each to import everything: in parallel.
        errors: list[BaseException] = []

        def start(process):
            try:
                process.start(timeout=60)
            except BaseException as exc:  # noqa: BLE001 (reported below)
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(p,)) for p in (*self.workers, *self.webs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        if errors:
            raise errors[0]
        for process in (*self.routers, self.reclaimer):
            wait_for(
                lambda p=process: _http_ok(self.metrics_ports[id(p)]) or not alive(p),
                timeout=60,
                interval=0.1,
                message=f"{process.name} metrics port",
            )
            assert alive(process), f"{process.name} exited:\n{process.log()[-3000:]}"

    def stop(self) -> None:
        processes = [*self.webs, *self.workers, *self.routers, self.reclaimer, self.sweeper]
        threads = [threading.Thread(target=p.stop) for p in processes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(40)
        for process in processes:  # whatever did not stop in time
            process.kill() if alive(process) else None

    # Faults (blocking: the injector runs them in threads) ------------------------------------

    def kill_router(self, slot: int, *, same_name: bool, pause: float) -> str:
        old = self.routers[slot]
        old.kill()
        time.sleep(pause)
        if same_name:
            consumer = self.consumer_names[id(old)]
        else:
            self._incarnations += 1
            consumer = f"chaos-router-{slot}-{self._incarnations}"
        new = self._new_router(consumer)
        new.start()
        self.routers[slot] = new
        return consumer

    def worker_log(self, worker: Worker) -> str:
        return worker.log()[self.worker_log_start[worker.name] :]

    def kill_worker(self, worker: Worker, pause: float) -> None:
        worker.kill()
        time.sleep(pause)
        self.worker_log_start[worker.name] = len(worker.log())
        restart(worker, timeout=60)

    def kill_web(self, web: Web, pause: float) -> None:
        web.kill()
        time.sleep(pause)
        restart(web, timeout=60)

    def kill_pool(self, worker: Worker) -> list[int]:
        pids = child_pids(worker.pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids


def _http_ok(port: int) -> bool:
    try:
        status, _, _ = http_request(port, "GET", "/", timeout=1)
        return status == 200
    except OSError:
        return False


# HTTP ------------------------------------------------------------------------------------------


def http_request(
    port: int,
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    headers: dict | None = None,
    timeout: float = 30,
) -> tuple[int, list[tuple[str, str]], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.getheaders(), response.read()
    finally:
        connection.close()


def header(headers: list[tuple[str, str]], name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name.lower():
            return value
    return None


def problem_type(body: bytes) -> str | None:
    """The `type` of an application/problem+json body (None: not a problem)."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value.get("type") if isinstance(value, dict) else None


def cookies_of(headers: list[tuple[str, str]]) -> dict[str, str]:
    jar = SimpleCookie()
    for key, value in headers:
        if key.lower() == "set-cookie":
            jar.load(value)
    return {name: morsel.value for name, morsel in jar.items()}


def login(port: int, username: str, password: str) -> str:
    """Log in through /accounts/login/ as a browser does; the session cookie's value."""
    status, headers, body = http_request(port, "GET", "/accounts/login/")
    assert status == 200, f"GET /accounts/login/: {status}"
    csrf_cookie = cookies_of(headers)["csrftoken"]
    match = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', body)
    assert match, "no csrfmiddlewaretoken in the login page"
    form = urllib.parse.urlencode(
        {
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": match.group(1).decode(),
            "next": "/",
        }
    ).encode()
    status, headers, _ = http_request(
        port,
        "POST",
        "/accounts/login/",
        body=form,
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": f"csrftoken={csrf_cookie}",
        },
    )
    assert status == 302, f"login of {username}: {status}"
    return cookies_of(headers)["sessionid"]


# Workload records --------------------------------------------------------------------------------


@dataclass
class User:
    username: str
    password: str
    token: str
    session: str = ""
    pk: int = 0


@dataclass
class Answer:
    """The resolved answer to one copy of a POST (after its 409s were retried)."""

    status: int
    body: bytes
    replayed: bool
    conflicts: int  # 409 in-flight answers retried before this one
    transport_errors: int
    sent_at: float
    at: float
    # Of the transport errors, those after the request went out (the connection dropped with no
    # answer, as when a web server dies mid-request), and the 503s of a lost database connection: the
    # server may have run it and stored its answer.
    answers_lost: int = 0
    database_unavailable: int = 0  # 503 answers retried (the database connection was lost)


@dataclass
class Watch:
    """One WebSocket client of a job, over all its connections."""

    index: int
    events: list[tuple[int, int, int]] = field(default_factory=list)  # (seq, prev_seq, connection #)
    connections: int = 0
    cuts_clean: int = 0
    cuts_abort: int = 0
    closes: list[int] = field(default_factory=list)  # close codes the server sent
    connect_errors: list[str] = field(default_factory=list)
    resets: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    done: bool = False
    started_late: bool = False  # connected only after the job had completed (a backfill only)

    @property
    def seqs(self) -> list[int]:
        return [seq for seq, _, _ in self.events]


@dataclass
class Job:
    """One key of the workload: a job (scan, chat) POSTed to /api/jobs/, or a task (domain
    `task`: `payload` is the body POSTed to /demo/tasks/); `job_id` is the job's id either way
    (a task's result id is its job's)."""

    index: int
    user: User
    key: str
    domain: str
    payload: dict
    copies: int
    concurrent: bool
    expected: list[int]
    answers: list[Answer] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # copies that never got an answer
    job_id: str | None = None
    watches: list[Watch] = field(default_factory=list)
    signalling: durable.Signalling | None = None  # a durable_chaos job's signal (tests/e2e/durable.py)

    @property
    def is_task(self) -> bool:
        from eventbus.djangotasks.names import TASK_JOB

        return self.domain == TASK_JOB

    @property
    def path(self) -> str:
        return TASKS_PATH if self.is_task else "/api/jobs/"

    @property
    def body(self) -> dict:
        return self.payload if self.is_task else {"domain": self.domain, "payload": self.payload}

    @property
    def id_field(self) -> str:
        return "task_id" if self.is_task else "job_id"

    @property
    def final_seq(self) -> int:
        return self.expected[-1]

    @property
    def task_key(self) -> str:
        """A task's job key: the request's key's first derived key (eventbus.djangotasks.keys)."""
        return f"{self.key}:1"


def expected_seqs(domain: str, payload: dict) -> list[int]:
    from eventbus.testing import events_of

    return [seq for _stage, seq, _data in events_of(domain, payload)]


def task_seqs(n: int) -> list[int]:
    """record_visit(n)'s seqs: one progress event per visit in its `run` stage, then the final."""
    from eventbus.djangotasks.taskjob import TaskJob

    first = TaskJob.plan()[0].first_seq
    return [first + i for i in range(n)] + [TaskJob.final_seq()]


WORDS = [
    "exactly",
    "once",
    "delivery",
    "stream",
    "router",
    "reclaim",
    "lease",
    "replay",
    "socket",
    "backfill",
    "history",
    "shard",
]


# The run -------------------------------------------------------------------------------------------


@dataclass
class Result:
    ok: bool
    failures: list[str]
    figures: dict
    report: str


class Run:
    @property
    def stack(self) -> Stack:
        assert self._stack is not None, "the stack is not started"
        return self._stack

    def __init__(self, config: ChaosConfig):
        self.config = config
        self.seed = config.seed if config.seed is not None else random.randrange(2**32)
        self.rng = random.Random(self.seed)
        if config.cluster and config.sentinel:
            raise ValueError("a run is on a Redis Cluster or on a Sentinel-managed Redis, not both")
        self.topology = Topology(
            cluster=config.cluster,
            rng=self.rng,
            sentinel=config.sentinel,
            replicas=1 if config.cluster and config.failovers else 0,
        )
        self._stack: Stack | None = None
        self.users: list[User] = []
        self.jobs: list[Job] = []
        self.faults: dict[str, list] = {
            "router_kills": [],
            "worker_kills": [],
            "pool_kills": [],
            "client_kill_normal": [],
            "client_kill_pubsub": [],
        }
        if config.daphne_kills:
            self.faults["daphne_kills"] = []
        plain = not (config.cluster or config.sentinel)
        if config.redis_restarts and plain:
            self.faults["redis_restarts"] = []
        self.proxy: StallingProxy | None = None
        if config.network_stalls and plain:
            self.faults["network_stalls"] = []
        if config.failovers and (config.sentinel or config.cluster):
            self.faults["failovers"] = []
        from django.db import connection

        if config.backend_kills and connection.vendor == "postgresql":
            self.faults["backend_kills"] = []
        self.open_sockets: dict[int, int] = {}  # web server port -> watchers connected to it now
        self.metrics: dict[int, dict] = {}  # id(process) -> last scraped samples
        self.timings: dict[str, float] = {}
        self.prefix = f"chaos{uuid.uuid4().hex[:6]}"

    @property
    def redis_kind(self) -> str:
        if self.config.cluster:
            replicas = " with a replica each" if self.topology.cluster_servers.replicas else ""
            return f"3-master Redis Cluster{replicas}"
        return "Sentinel-managed Redis" if self.config.sentinel else "plain Redis"

    def say(self, message: str) -> None:
        if self.config.progress:
            log.warning("[chaos %5.1fs] %s", time.monotonic() - self.t0, message)

    # Setup ------------------------------------------------------------------------------------------

    def create_users(self) -> None:
        from django.contrib.auth import get_user_model
        from rest_framework.authtoken.models import Token

        User_ = get_user_model()
        for i in range(self.config.clients):
            password = uuid.uuid4().hex
            user = User_.objects.create_user(f"{self.prefix}-{i}", password=password)
            token = Token.objects.create(user=user)
            self.users.append(User(user.username, password, token.key, pk=user.pk))

    def plan(self) -> None:
        from eventbus.djangotasks.names import TASK_JOB

        jobs = self.config.jobs
        # A share of the keys are tasks in place of jobs (the run's size stays), half of them delayed.
        tasks = self.rng.sample(range(jobs), min(jobs, round(jobs * self.config.task_share)))
        delayed = set(self.rng.sample(tasks, round(len(tasks) * self.config.delayed_task_share)))
        # As many of the other keys are durable_chaos jobs (the run's size stays).
        others = sorted(set(range(jobs)) - set(tasks))
        durables = set(self.rng.sample(others, min(len(others), round(jobs * self.config.durable_share))))
        for index in range(jobs):
            user = self.users[index % len(self.users)]
            domain = (
                TASK_JOB
                if index in tasks
                else DURABLE
                if index in durables
                else self.rng.choice(("scan", "chat"))
            )
            expected: list[int] | None = None
            payload: dict[str, object]
            signalling = None
            if domain == DURABLE:
                payload, signalling = durable.plan(self.rng, self.config, user.username)
                expected = durable_seqs()
            elif domain == TASK_JOB:
                n = self.rng.randint(1, 5)  # visits: a stage's work each (STAGE_SECONDS), as a scan's
                payload = {"n": n}
                if index in delayed:
                    payload["delay"] = round(self.rng.uniform(1, 5), 2)
                expected = task_seqs(n)
            elif domain == "chat":
                words = self.rng.randint(1, 30)
                payload = {"prompt": " ".join(self.rng.choice(WORDS) for _ in range(words))}
            else:
                payload = {"image": f"img-{index}", "size": self.rng.randint(1, 4096)}
            copies = self.rng.randint(1, self.config.max_copies)
            job = Job(
                index,
                user,
                str(uuid.uuid4()),
                domain,
                payload,
                copies,
                concurrent=copies > 1 and self.rng.random() < 0.5,
                expected=expected or expected_seqs(domain, payload),
                signalling=signalling,
            )
            job.watches = [Watch(i) for i in range(self.rng.randint(1, self.config.max_watchers))]
            self.jobs.append(job)

    # The workload -------------------------------------------------------------------------------------

    async def post_copy(self, job: Job, delay: float) -> None:
        await asyncio.sleep(delay)
        answer = await self.send_keyed(job.user, job.path, job.body, job.key, failures=job.failures)
        if answer is None:
            return
        job.answers.append(answer)
        if answer.status == 201 and job.job_id is None:
            job.job_id = json.loads(answer.body)[job.id_field]

    async def send_keyed(
        self,
        user: User,
        path: str,
        body: dict,
        key: str,
        *,
        failures: list[str],
        final_409: tuple[str, ...] = (),
    ) -> Answer | None:
        """POST `body` under the Idempotency-Key `key` until it gets an answer: sent again after
        a transport error, a 503 of a lost database connection, a 429 and a 409 (in flight),
        except a 409 problem of a type in `final_409` (an answer). The answer; None when none
        came. What went wrong on the way (an answer without what its status promises, no
        answer at all) is added to `failures`."""
        data = json.dumps(body).encode()
        headers = {
            "Authorization": f"Token {user.token}",
            "Idempotency-Key": key,
            "Content-Type": "application/json",
        }
        conflicts = transport_errors = answers_lost = unavailable = 0
        sent_at = time.monotonic()
        deadline = sent_at + 60
        while time.monotonic() < deadline:
            try:
                port = self.rng.choice(self.stack.ports)
                status, response_headers, content = await asyncio.to_thread(
                    http_request, port, "POST", path, body=data, headers=headers
                )
            except (OSError, http.client.HTTPException) as exc:
                transport_errors += 1
                answers_lost += not isinstance(exc, ConnectionRefusedError)
                self.say(f"POST {path} {key}: {type(exc).__name__}: {exc}; sent again")
                await asyncio.sleep(0.5)
                continue
            content_type = header(response_headers, "Content-Type") or ""
            if status == 503 and content_type.startswith("application/problem+json"):
                # The database connection was lost mid-request: the work committed with its
                # answer (the retry replays it) or not at all. Its answer may be lost either way.
                unavailable += 1
                answers_lost += 1
                if header(response_headers, "Retry-After") is None:
                    failures.append(f"got a 503 without Retry-After: {response_headers}")
                await asyncio.sleep(0.2 + self.rng.random() * 0.3)
                continue
            if status == 429:
                # Over the user's running-job cap (a long run's many jobs per client) or throttled:
                # nothing was stored under the key, so it is sent again, as a client would.
                if header(response_headers, "Retry-After") is None or "problem+json" not in content_type:
                    failures.append(f"got a 429 without Retry-After or not a problem: {response_headers}")
                await asyncio.sleep(0.5 + self.rng.random() * 0.5)
                continue
            if status == 409 and not (final_409 and problem_type(content) in final_409):
                conflicts += 1
                if header(response_headers, "Retry-After") is None or "problem+json" not in content_type:
                    failures.append(f"got a 409 without Retry-After or not a problem: {response_headers}")
                await asyncio.sleep(0.1 + self.rng.random() * 0.3)
                continue
            return Answer(
                status,
                content,
                header(response_headers, "Idempotent-Replayed") == "true",
                conflicts,
                transport_errors,
                sent_at,
                time.monotonic(),
                answers_lost,
                unavailable,
            )
        failures.append(
            f"no answer but 409/503/transport errors for 60 s ({conflicts} x 409, {unavailable} x 503, "
            f"{transport_errors} transport errors)"
        )
        return None

    async def get_json(self, user: User, path: str) -> tuple[int, dict | None]:
        """GET `path` as `user` once: (status, its JSON body on a 200); (0, None) when the
        request got no answer (a web server down)."""
        try:
            status, _, content = await asyncio.to_thread(
                http_request,
                self.rng.choice(self.stack.ports),
                "GET",
                path,
                headers={"Authorization": f"Token {user.token}"},
                timeout=10,
            )
        except (OSError, http.client.HTTPException):
            return 0, None
        if status != 200:
            return status, None
        try:
            return status, json.loads(content)
        except ValueError:
            return 0, None

    async def run_job(self, job: Job) -> None:
        if job.concurrent:
            await asyncio.gather(*(self.post_copy(job, 0) for _ in range(job.copies)))
        else:
            for _ in range(job.copies):
                await self.post_copy(job, self.rng.uniform(0, 1.5) if job.answers else 0)
        if job.job_id is None:
            return
        for watch in job.watches:
            # Most watchers open at once and see the job live; the others come later, some after
            # the job ended (a backfill only).
            delay = self.rng.uniform(0, 0.3) if self.rng.random() < 0.6 else self.rng.uniform(0.3, 4)
            self.watchers.append(asyncio.create_task(self.watch(job, watch, delay)))
        if job.signalling is not None:
            await durable.signal(self, job)  # the faults go on until every signal is sent

    async def client(self, jobs: list[Job]) -> None:
        # This client's jobs at random moments of the run's duration.
        started = time.monotonic()
        for at, job in zip(sorted(self.rng.uniform(0, self.config.duration) for _ in jobs), jobs):
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            self.posts.append(asyncio.create_task(self.run_job(job)))

    async def watch(self, job: Job, watch: Watch, delay: float) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
        from websockets.typing import Origin

        await asyncio.sleep(delay)
        rng = random.Random(self.rng.random())
        cuts_left = rng.randint(0, 3)
        last_seq = 0
        headers = {"Cookie": f"sessionid={job.user.session}"}
        while not self.stop_watching.is_set():
            cut_at = None
            port = rng.choice(self.stack.ports)
            uri = f"ws://127.0.0.1:{port}/ws/jobs/{job.job_id}/"
            opened = False
            try:
                async with connect(
                    f"{uri}?last_seq={last_seq}",
                    origin=Origin(f"http://127.0.0.1:{port}"),
                    additional_headers=headers,
                    open_timeout=10,
                    close_timeout=2,
                    ping_interval=None,
                    max_queue=None,
                ) as ws:
                    watch.connections += 1
                    connection = watch.connections
                    self.open_sockets[port] = self.open_sockets.get(port, 0) + 1
                    opened = True
                    if cuts_left and rng.random() < 0.8:
                        cut_at = time.monotonic() + rng.uniform(0.02, 1.5)
                    while not self.stop_watching.is_set():
                        timeout = 1.0 if cut_at is None else max(0.0, min(1.0, cut_at - time.monotonic()))
                        try:
                            raw = await asyncio.wait_for(ws.recv(), timeout)
                        except TimeoutError:
                            if cut_at is not None and time.monotonic() >= cut_at:
                                cuts_left -= 1
                                if rng.random() < 0.5:
                                    watch.cuts_abort += 1
                                    ws.transport.abort()  # the TCP connection drops: no close frame
                                else:
                                    watch.cuts_clean += 1
                                    await ws.close()
                                break
                            continue
                        frame = json.loads(raw)
                        kind = frame.get("type")
                        if kind == "event":
                            watch.events.append((frame["seq"], frame.get("prev_seq", -1), connection))
                            last_seq = max(last_seq, frame["seq"])
                            if frame["seq"] == job.final_seq:
                                watch.done = True
                                await ws.close()
                                return
                        elif kind == "reset":
                            watch.resets.append(frame)
                            last_seq = max(last_seq, int(frame.get("state", {}).get("seq", 0)))
                        else:
                            watch.errors.append(frame)
            except ConnectionClosed as closed:
                if closed.rcvd is not None:
                    watch.closes.append(closed.rcvd.code)
            except (OSError, InvalidHandshake, InvalidStatus, TimeoutError) as exc:
                watch.connect_errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                if opened:
                    self.open_sockets[port] -= 1
            await asyncio.sleep(rng.uniform(0, 0.4))

    # Faults ----------------------------------------------------------------------------------------

    def mid_job(self, worker: Worker, bus) -> list[str]:
        """Jobs this worker runs right now, between their first and their final event."""
        text = self.stack.worker_log(worker)
        running = set(re.findall(rf"Job ({UUID_RE}) running", text))
        ended = set(re.findall(rf"Task eventbus\.run_job\[({UUID_RE})\] (?:succeeded|retry|raised)", text))
        candidates = list(running - ended)
        if not candidates:
            return []
        from eventbus.bus.keys import JobKeys

        known = {job.job_id: job for job in self.jobs if job.job_id}
        found = []
        for job_id in candidates:
            if job_id not in known:
                continue
            seq = int(bus.get(JobKeys(known[job_id].domain, job_id).last_published) or 0)
            if 0 < seq < known[job_id].final_seq:
                found.append(job_id)
        return found

    async def kill_mid_job(self, kind: str) -> None:
        """Wait (bounded) until a worker is mid-job, then SIGKILL it (or its pool) there."""
        bus = self.topology.bus()
        try:
            deadline = time.monotonic() + max(20.0, self.config.duration)
            while time.monotonic() < deadline and not self.stop_faults.is_set():
                for worker in self.rng.sample(self.stack.workers, len(self.stack.workers)):
                    if not alive(worker):
                        continue
                    try:
                        busy = await asyncio.to_thread(self.mid_job, worker, bus)
                    except redis.RedisError:
                        busy = []
                    if not busy:
                        continue
                    if kind == "worker_kills":
                        self.say(f"SIGKILL worker {worker.name} mid-job ({len(busy)} job(s) in hand)")
                        await asyncio.to_thread(self.stack.kill_worker, worker, self.rng.uniform(0.2, 1.0))
                        self.faults[kind].append({"worker": worker.name, "jobs": busy})
                    else:
                        pids = await asyncio.to_thread(self.stack.kill_pool, worker)
                        self.say(f"SIGKILL pool {pids} of {worker.name} mid-job ({len(busy)} job(s) in hand)")
                        self.faults[kind].append({"worker": worker.name, "pids": pids, "jobs": busy})
                    return
                await asyncio.sleep(0.05)
            self.say(f"{kind}: no worker was mid-job in time")
        finally:
            bus.close()

    async def routers_chaos(self) -> None:
        low, high = self.config.router_kill_every
        same_name = False
        while True:
            try:
                await asyncio.wait_for(self.stop_faults.wait(), self.rng.uniform(low, high))
                return
            except TimeoutError:
                pass
            slot = self.rng.randrange(len(self.stack.routers))
            same_name = not same_name
            # Aim: kill it while it holds entries (read, not yet acked), for up to 1.5 s.
            held = await asyncio.to_thread(self.wait_holding, slot, 1.5)
            consumer = await asyncio.to_thread(
                self.stack.kill_router, slot, same_name=same_name, pause=self.rng.uniform(0.1, 1.0)
            )
            self.faults["router_kills"].append({"slot": slot, "held": held, "restarted_as": consumer})
            self.say(f"SIGKILL router {slot} holding {held} entries; restarted as {consumer}")

    def wait_holding(self, slot: int, timeout: float) -> int:
        """Poll the group until the router of `slot` has entries pending (read, unacked);
        how many it had when the wait ended."""
        from eventbus.conf import eventbus_settings

        consumer = self.stack.consumer_names[id(self.stack.routers[slot])]
        deadline = time.monotonic() + timeout
        held = 0
        while time.monotonic() < deadline:
            try:
                pipe = self.fault_bus.pipeline(transaction=False)
                for stream in streams():
                    pipe.xpending(stream.key, eventbus_settings.GROUP)
                held = sum(
                    int(row["pending"])
                    for summary in pipe.execute(raise_on_error=False)
                    if isinstance(summary, dict)
                    for row in summary.get("consumers") or ()
                    if row["name"] == consumer
                )
            except redis.RedisError:
                held = 0
            if held:
                return held
            time.sleep(0.003)
        return held

    async def client_kill(self, kind: str, at: float) -> None:
        await asyncio.sleep(at)
        if kind == "pubsub":
            # Aim at the gateway hub: only while it is subscribed to a job's channel is its
            # connection of TYPE pubsub (the workers' broker pub/sub connections always are).
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not await asyncio.to_thread(
                self.topology.job_channels_listened
            ):
                await asyncio.sleep(0.05)
        killed = await asyncio.to_thread(self.topology.client_kill, kind)
        self.faults[f"client_kill_{kind}"].append(killed)
        self.say(f"CLIENT KILL TYPE {kind}: {killed} connection(s)")

    async def kill_daphne(self, at: float) -> None:
        """SIGKILL the first web server once watchers are connected to it (bounded wait), restart it."""
        await asyncio.sleep(at)
        web = self.stack.webs[0]
        deadline = time.monotonic() + 20
        while not self.open_sockets.get(web_port := self.stack.ports[0]) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        cut = self.open_sockets.get(web_port, 0)
        await asyncio.to_thread(self.stack.kill_web, web, self.rng.uniform(0.5, 1.5))
        self.faults["daphne_kills"].append({"sockets_cut": cut})
        self.say(f"SIGKILL web server :{web_port} with {cut} socket(s) open; started again")

    async def stall_network(self, at: float) -> None:
        """The workers' link to Redis holds every byte for 1.5-3 s, then resets every connection."""
        await asyncio.sleep(at)
        assert self.proxy is not None
        seconds = self.rng.uniform(1.5, 3.0)
        await asyncio.to_thread(self.proxy.stall, seconds)
        dropped = await asyncio.to_thread(self.proxy.drop)
        self.faults["network_stalls"].append(
            {"stalled_seconds": round(seconds, 2), "connections_reset": dropped}
        )
        self.say(f"workers' network to Redis stalled {seconds:.2f}s, then {dropped} connection(s) reset")

    async def restart_redis(self, at: float) -> None:
        await asyncio.sleep(at)
        pause = self.rng.uniform(0.2, 1.0)
        started = time.monotonic()
        await asyncio.to_thread(self.topology.restart_plain, pause)
        self.faults["redis_restarts"].append({"down_seconds": round(time.monotonic() - started, 2)})
        self.say(f"SIGKILL Redis; started again from its AOF after {pause:.2f}s")

    async def failover(self, at: float) -> None:
        """SENTINEL FAILOVER, or on the cluster CLUSTER FAILOVER of a master picked at random:
        the replica becomes the master, the old master its replica."""
        await asyncio.sleep(at)
        started = time.monotonic()
        if self.config.cluster:
            servers = self.topology.cluster_servers
            old = self.rng.choice(sorted(port for port, role in servers.roles().items() if role == "master"))
            new = await asyncio.to_thread(servers.failover, old)
            kind = "Cluster"
        else:
            group = self.topology.sentinels
            assert group is not None
            old = group.master_port()
            new = await asyncio.to_thread(group.failover)
            kind = "Sentinel"
        took = time.monotonic() - started
        self.faults["failovers"].append({"from": old, "to": new, "seconds": round(took, 2)})
        self.say(f"{kind} failover: master :{old} -> :{new} in {took:.2f}s")

    async def kill_backends(self, at: float) -> None:
        await asyncio.sleep(at)
        killed = await asyncio.to_thread(terminate_backends, 20.0)
        self.faults["backend_kills"].append(killed)
        self.say(f"pg_terminate_backend: {killed}")

    async def faults_run(self) -> None:
        self.fault_bus = self.topology.bus()
        try:
            await self._faults_run()
        finally:
            self.fault_bus.close()

    async def _faults_run(self) -> None:
        duration = self.config.duration
        tasks = [asyncio.create_task(self.routers_chaos())]
        scheduled = [
            *(
                ("worker_kills", duration * (0.15 + 0.6 * i / max(1, self.config.worker_kills)))
                for i in range(self.config.worker_kills)
            ),
            *(
                ("pool_kills", duration * (0.3 + 0.5 * i / max(1, self.config.pool_kills)))
                for i in range(self.config.pool_kills)
            ),
        ]

        async def later(kind, at):
            await asyncio.sleep(at)
            await self.kill_mid_job(kind)

        one_shots = [asyncio.create_task(later(kind, at)) for kind, at in scheduled]
        one_shots.append(asyncio.create_task(self.client_kill("normal", duration * 0.35)))
        one_shots.append(asyncio.create_task(self.client_kill("pubsub", duration * 0.55)))
        one_shots.extend(
            asyncio.create_task(self.kill_daphne(duration * (0.5 + 0.3 * i / self.config.daphne_kills)))
            for i in range(self.config.daphne_kills)
        )
        if "network_stalls" in self.faults:
            one_shots.extend(
                asyncio.create_task(
                    self.stall_network(duration * (0.6 + 0.3 * i / self.config.network_stalls))
                )
                for i in range(self.config.network_stalls)
            )
        if "redis_restarts" in self.faults:
            one_shots.extend(
                asyncio.create_task(
                    self.restart_redis(duration * (0.45 + 0.4 * i / self.config.redis_restarts))
                )
                for i in range(self.config.redis_restarts)
            )
        if "failovers" in self.faults:
            one_shots.extend(
                asyncio.create_task(self.failover(duration * (0.4 + 0.4 * i / self.config.failovers)))
                for i in range(self.config.failovers)
            )
        if "backend_kills" in self.faults:
            one_shots.extend(
                asyncio.create_task(
                    self.kill_backends(duration * (0.25 + 0.6 * i / self.config.backend_kills))
                )
                for i in range(self.config.backend_kills)
            )
        await asyncio.gather(*one_shots)
        await self.posts_done.wait()
        self.stop_faults.set()
        await asyncio.gather(*tasks)

    # Metrics -----------------------------------------------------------------------------------------

    def scrape(self) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        for process in self.stack.metered:
            if not alive(process):
                continue
            try:
                status, _, body = http_request(self.stack.metrics_ports[id(process)], "GET", "/", timeout=2)
            except OSError:
                continue
            if status != 200:
                continue
            samples = {}
            for family in text_string_to_metric_families(body.decode()):
                for sample in family.samples:
                    if sample.name.endswith("_total") or sample.name.endswith("_count"):
                        key = (sample.name, tuple(sorted(sample.labels.items())))
                        samples[key] = sample.value
            self.metrics[id(process)] = samples

    async def scraper(self) -> None:
        while not self.scraping_done.is_set():
            await asyncio.to_thread(self.scrape)
            try:
                await asyncio.wait_for(self.scraping_done.wait(), 0.5)
            except TimeoutError:
                pass

    # Main ------------------------------------------------------------------------------------------

    async def workload(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=64, thread_name_prefix="chaos-http"))
        self.posts: list[asyncio.Task] = []
        self.watchers: list[asyncio.Task] = []
        self.posts_done = asyncio.Event()
        self.stop_faults = asyncio.Event()
        self.stop_watching = asyncio.Event()
        self.scraping_done = asyncio.Event()
        scraper = asyncio.create_task(self.scraper())
        faults = asyncio.create_task(self.faults_run())
        by_user: dict[str, list[Job]] = {}
        for job in self.jobs:
            by_user.setdefault(job.user.username, []).append(job)
        started = time.monotonic()
        await asyncio.gather(*(self.client(jobs) for jobs in by_user.values()))
        await asyncio.gather(*self.posts)
        self.timings["posting"] = time.monotonic() - started
        self.say(f"all {len(self.jobs)} jobs posted")
        self.posts_done.set()
        await faults
        self.timings["faults"] = time.monotonic() - started
        self.say("faults over; waiting for the watchers")
        # Watchers finish when their job's final event arrives; bounded by the settle time.
        deadline = self.config.settle_timeout
        done, pending = (
            await asyncio.wait(self.watchers, timeout=deadline) if self.watchers else (set(), set())
        )
        self.stop_watching.set()
        if pending:
            await asyncio.wait(pending, timeout=10)
            for task in pending:
                task.cancel()
        self.timings["watching"] = time.monotonic() - started
        self.scraping_done.set()
        await scraper

    def settle(self, timeout: float) -> None:
        """Wait (bounded) until every job completed and nothing is pending in the streams."""
        from eventbus.models import Job as JobRow

        bus = self.topology.bus()
        try:

            def quiet():
                states = JobRow.objects.filter(owner__username__startswith=self.prefix).exclude(
                    state=JobRow.State.COMPLETED
                )
                if states.exists():
                    return False
                return sum(pending_count(bus, stream) for stream in streams()) == 0

            try:
                wait_for(
                    quiet, timeout=timeout, interval=0.25, message="every job completed and no entry pending"
                )
            except AssertionError as exc:
                self.say(str(exc))
        finally:
            bus.close()

    def execute(self) -> Result:
        self.t0 = time.monotonic()
        self.create_users()
        self.plan()
        self.topology.start()
        os.environ.setdefault("REDIS_URL", self.topology.bus_url)  # tests.processes.process_env reads it
        if "network_stalls" in self.faults:
            self.proxy = StallingProxy(self.topology.broker.port).start()
        self._stack = Stack(self.topology, self.config, workers_redis=self.proxy.url if self.proxy else None)
        try:
            self.say(f"seed {self.seed}; starting the stack ({self.redis_kind})")
            self.stack.start()
            self.timings["startup"] = time.monotonic() - self.t0
            for user in self.users:
                user.session = login(self.stack.port, user.username, user.password)
            self.say(
                f"stack up on port {self.stack.port}; {len(self.jobs)} jobs by {len(self.users)} clients"
            )
            workload_started = time.monotonic()
            asyncio.run(self.workload())
            self.settle(max(10.0, self.config.settle_timeout / 2))
            self.timings["workload"] = time.monotonic() - workload_started
            self.scrape()
            web_metrics = self.web_metrics()
            self.exited = [p for p in self.stack.live if not alive(p)]  # died by themselves: a crash
            self.details = self.job_details()
            checker = Checker(self, web_metrics)
            result = checker.check()
            return result
        finally:
            self.stack.stop()
            if self.proxy is not None:
                self.proxy.stop()
            self.topology.stop()

    def job_details(self) -> dict[str, tuple[int, dict | None]]:
        """GET /api/jobs/<id>/ of every job, as its owner: (status, body). A GET the user's jobs
        throttle refuses (429: the user's polls and POSTs of the last minute) is sent again
        after its Retry-After, for up to THROTTLED_DETAILS_WAIT seconds in all."""
        details = {}
        deadline = time.monotonic() + THROTTLED_DETAILS_WAIT
        for job in self.jobs:
            if not job.job_id:
                continue
            while True:
                try:
                    status, headers, body = http_request(
                        self.stack.port,
                        "GET",
                        f"/api/jobs/{job.job_id}/",
                        headers={"Authorization": f"Token {job.user.token}"},
                        timeout=10,
                    )
                    details[job.job_id] = (status, json.loads(body) if status == 200 else None)
                except (OSError, ValueError) as exc:
                    details[job.job_id] = (0, {"error": repr(exc)})
                    break
                if status != 429 or time.monotonic() > deadline:
                    break
                time.sleep(min(5.0, float(header(headers, "Retry-After") or 1)))
        return details

    def web_metrics(self) -> dict:
        """idempotency_requests_total by outcome, added up over both web servers (a killed web server's
        counts before its kill are gone: lower bounds then)."""
        from prometheus_client.parser import text_string_to_metric_families

        outcomes: dict[str, int] = {}
        for port in self.stack.ports:
            try:
                status, _, body = http_request(port, "GET", "/metrics", timeout=10)
            except OSError:
                continue
            for family in text_string_to_metric_families(body.decode()):
                for sample in family.samples:
                    if sample.name == "idempotency_requests_total":
                        outcome = sample.labels["outcome"]
                        outcomes[outcome] = outcomes.get(outcome, 0) + int(sample.value)
        return outcomes


def terminate_backends(timeout: float) -> dict[str, int]:
    """Wait (bounded) until a web server's PostgreSQL session is mid-request, then pg_terminate_backend
    it with every session of the other processes of the stack (workers mid-task, the sweeper):
    what a failover or a restart does to them. Returns how many sessions were ended, by kind."""
    from django.db import connection

    killed: dict[str, int] = {}
    try:
        with connection.cursor() as cursor:
            deadline = time.monotonic() + timeout
            while not killed.get("web_mid_request") and time.monotonic() < deadline:
                # Django closes a request's connection at its end (CONN_MAX_AGE 0): a web server
                # session that exists belongs to a request (or a socket's query) in progress.
                # One statement, so the request cannot end between seeing and killing it
                # (a session gone meanwhile reports false: try again).
                cursor.execute(
                    "SELECT application_name, pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND application_name LIKE 'chaos-%%' AND EXISTS (SELECT 1 FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = %s)",
                    [WEB_APP],
                )
                for name, done in cursor.fetchall():
                    if done:
                        key = "web_mid_request" if name == WEB_APP else name.removeprefix("chaos-")
                        killed[key] = killed.get(key, 0) + 1
                if not killed.get("web_mid_request"):
                    time.sleep(0.001)
            return killed
    finally:
        connection.close()  # this thread's own session, not the run's


def streams():
    from eventbus.bus.delivery import streams_for

    return streams_for()


def pending_count(bus, stream) -> int:
    from eventbus.conf import eventbus_settings

    try:
        summary = bus.xpending(stream.key, eventbus_settings.GROUP)
    except redis.ResponseError:  # no group yet
        return 0
    return int(summary["pending"])


# The checker -------------------------------------------------------------------------------------


class Checker:
    """Reads what every layer recorded and compares it with what the workload did."""

    def __init__(self, run: Run, web_metrics: dict):
        self.run = run
        self.web_metrics = web_metrics
        self.failures: list[str] = []
        self.figures: dict = {}

    def fail(self, message: str) -> None:
        self.failures.append(message)

    def check(self) -> Result:
        run = self.run
        jobs = [job for job in run.jobs]
        self.check_answers(jobs)
        self.check_job_rows(jobs)
        # The durable jobs' children: (id, domain, expected seqs), executed and streamed as jobs are.
        self.children = durable.check(self, jobs)
        self.check_executions(jobs)
        self.check_tasks(jobs)
        self.check_redis(jobs)
        self.check_watchers(jobs)
        self.check_faults()
        self.count_layers()
        self.figures["wall_time_s"] = round(time.monotonic() - run.t0, 1)
        self.figures["timings_s"] = {k: round(v, 1) for k, v in run.timings.items()}
        report = self.report()
        return Result(not self.failures, self.failures, self.figures, report)

    # L0: the API ----------------------------------------------------------------------------------

    def check_answers(self, jobs: list[Job]) -> None:
        copies = conflicts = replayed = transport = lost_firsts = unavailable = 0
        for job in jobs:
            copies += job.copies
            for failure in job.failures:
                self.fail(f"key {job.key}: a copy of the POST {failure}")
            if not job.answers:
                continue
            conflicts += sum(a.conflicts for a in job.answers)
            transport += sum(a.transport_errors for a in job.answers)
            unavailable += sum(a.database_unavailable for a in job.answers)
            replayed += sum(a.replayed for a in job.answers)
            firsts = [a for a in job.answers if not a.replayed]
            lost = sum(a.answers_lost for a in job.answers)
            # The first answer may have been lost on its way (a web server died after the view ran and
            # stored it): then every answer the client got is a replay of it. Still one execution:
            # check_job_rows and check_executions count those.
            if len(firsts) != 1 and not (not firsts and lost):
                self.fail(
                    f"key {job.key}: {len(firsts)} answers were not replays (expected exactly 1): "
                    f"{[(a.status, a.body[:120]) for a in firsts]}"
                )
            lost_firsts += not firsts and bool(lost)
            reference = min(firsts or job.answers, key=lambda a: a.at)
            if reference.status != 201:
                self.fail(f"key {job.key}: first answer {reference.status} {reference.body[:300]!r}")
            for answer in job.answers:
                if (answer.status, answer.body) != (reference.status, reference.body):
                    self.fail(
                        f"key {job.key}: a retry got {answer.status} {answer.body[:200]!r}, the first got "
                        f"{reference.status} {reference.body[:200]!r}"
                    )
        self.figures["posts"] = {
            "keys": len(jobs),
            "copies_sent": copies,
            "replayed_answers": replayed,
            "409_in_flight_retried": conflicts,
            "transport_errors_retried": transport,
            "503_database_unavailable_retried": unavailable,
            "first_answers_lost_in_transit": lost_firsts,
            "concurrent_keys": sum(j.concurrent for j in jobs),
        }

    def check_job_rows(self, jobs: list[Job]) -> None:
        from eventbus.models import Job as JobRow
        from idempotency.models import IdempotencyRecord

        owned = JobRow.objects.filter(owner__username__startswith=self.run.prefix)
        # Nothing stranded: every job of the run's users (the durable jobs' children too) ended.
        stranded = list(owned.filter(state__in=JobRow.UNFINISHED_STATES).values_list("id", "domain", "state"))
        if stranded:
            self.fail(
                f"{len(stranded)} jobs left unfinished: {[(str(i), d, s) for i, d, s in stranded[:10]]}"
            )
        rows = list(owned.filter(parent__isnull=True))  # a key's job: started by a client, not a stage
        by_key: dict[tuple[int | None, str], list] = {}
        for row in rows:
            by_key.setdefault((row.owner_id, row.idem_key), []).append(row)
        records = {
            (r.scope, r.key): r for r in IdempotencyRecord.objects.filter(key__in=[job.key for job in jobs])
        }
        self.rows: dict[str, JobRow] = {}  # the job row of each key, by key
        for job in jobs:
            # A task's job is keyed from the request's key (its first enqueue), not by it.
            found = by_key.get((job.user.pk, job.task_key if job.is_task else job.key), [])
            if len(found) != 1:
                self.fail(f"key {job.key}: {len(found)} {job.domain} job rows (expected 1)")
                continue
            row = self.rows[job.key] = found[0]
            if row.domain != job.domain:
                self.fail(f"key {job.key}: a {row.domain} job row, not {job.domain}")
            if job.job_id and str(row.id) != job.job_id:
                self.fail(f"key {job.key}: the API answered job {job.job_id}, the job row is {row.id}")
            if row.state != JobRow.State.COMPLETED or row.completed_at is None:
                self.fail(f"job {row.id} ({job.domain}) is {row.state}, not COMPLETED")
            status, detail = self.run.details.get(str(row.id), (0, None))
            body = detail or {}
            latest = body.get("latest_event") or {}
            if status != 200 or body.get("state") != "COMPLETED" or latest.get("seq") != job.final_seq:
                self.fail(f"GET /api/jobs/{row.id}/: {status} {detail}")
            record = [r for (scope, key), r in records.items() if key == job.key]
            if len(record) != 1 or record[0].state != IdempotencyRecord.State.COMPLETED:
                self.fail(f"key {job.key}: idempotency records {[(r.scope, r.state) for r in record]}")
        self.figures["job_rows"] = len(rows)
        if len(rows) != len(jobs):
            self.fail(f"{len(rows)} job rows for {len(jobs)} keys")

    def check_executions(self, jobs: list[Job]) -> None:
        """One execution to completion per job: the worker logs tell (across every restart).

        - `Job <id> COMPLETED`: logged once the conditional UPDATE moved the job to COMPLETED
          (eventbus.job.lifecycle.end): it must appear once, or not at all when the pool process
          was killed between the UPDATE's commit and the log line and a redelivery then found
          the job COMPLETED already ('skipped'); never twice.
        - `Task eventbus.run_job[<id>] succeeded ...: 'COMPLETED'`: a run that went through the
          pipeline to its end; more than one means the job's work ran to completion twice.
        Re-deliveries after a kill are expected and counted: they end 'skipped' (already
        COMPLETED), wait for the run lease (retry), or re-run the pipeline after a crash (L1
        drops what the dead run published, which the stream check confirms).
        """
        text = "\n".join(worker.log() for worker in self.run.stack.workers)
        transitions = _count(rf"Job ({UUID_RE}) COMPLETED$", text)
        runs_completed = _count(
            rf"Task eventbus\.run_job\[({UUID_RE})\] succeeded in [0-9.]+s: 'COMPLETED'", text
        )
        received = _count(rf"Task eventbus\.run_job\[({UUID_RE})\] received", text)
        started = _count(rf"Job ({UUID_RE}) running", text)
        skipped = _count(rf"Task eventbus\.run_job\[({UUID_RE})\] succeeded in [0-9.]+s: 'skipped'", text)
        retried = _count(rf"Task eventbus\.run_job\[({UUID_RE})\] retry", text)
        lost = _count(rf"Job ({UUID_RE}): .*its new run finishes it", text)
        self.l1_duplicates = len(re.findall(r"duplicate dropped \(L1\)", text))
        ids = [job.job_id for job in jobs if job.job_id]
        for job_id in [*ids, *(child for child, _, _ in self.children)]:
            # Logged once, or not at all when its pool process was killed between the UPDATE's
            # commit and the log line: then a redelivery found it COMPLETED already (and
            # check_rows that the database and the API say COMPLETED).
            logged = transitions.get(job_id, 0)
            if logged > 1 or (logged == 0 and not skipped.get(job_id)):
                self.fail(f"job {job_id}: moved to COMPLETED {logged} times (expected 1)")
            if runs_completed.get(job_id, 0) > 1:
                self.fail(
                    f"job {job_id}: {runs_completed[job_id]} runs went through its pipeline to the end (expected 1)"
                )
        self.figures["executions"] = {
            "completed_transitions": sum(transitions.get(i, 0) for i in ids),
            "completed_unlogged_then_found_completed": sum(
                1 for i in ids if not transitions.get(i) and skipped.get(i)
            ),
            "runs_to_completion": sum(runs_completed.get(i, 0) for i in ids),
            "deliveries_received": sum(received.get(i, 0) for i in ids),
            "runs_started": sum(started.get(i, 0) for i in ids),
            "jobs_run_more_than_once": sum(1 for i in ids if started.get(i, 0) > 1),
            "redeliveries_skipped_already_completed": sum(skipped.get(i, 0) for i in ids),
            "lease_busy_retries": sum(retried.get(i, 0) for i in ids),
            "runs_that_lost_their_lease": sum(lost.get(i, 0) for i in ids),
            "worker_lost_errors": text.count("WorkerLostError"),
        }
        self.runs_started, self.runs_completed = started, runs_completed  # for check_tasks

    # The tasks ------------------------------------------------------------------------------------

    def check_tasks(self, jobs: list[Job]) -> None:
        """The django.tasks side of the task keys, whose job rows, streams, executions and
        watchers are checked with the jobs' (one job per key, COMPLETED once, its final event
        once, one run to completion).

        Each task's result, read through Django's task API (get_result), is SUCCESSFUL with
        record_visit's return value; its job runs config.tasks.record_visit with the POSTed n for
        the key's user; its run stage finished. A delayed task has its run_after and did not
        start before it (Job.started_at, its first run's start); any other has none. No task job
        of the run's users is outside the keys'. A run resumed after a worker or pool kill (or
        sent again after Redis lost it) is allowed: its attempts are counted.
        """
        from eventbus.djangotasks.compat import TaskResultStatus, task_backends
        from eventbus.djangotasks.names import RUN_STAGE, TASK_JOB
        from eventbus.models import Job as JobRow
        from eventbus.models import StageRecord

        tasks = [job for job in jobs if job.is_task]
        backend = task_backends["default"]
        attempts = resumed = 0
        lags: list[float] = []
        for job in tasks:
            row = self.rows.get(job.key)
            if row is None:
                continue  # check_job_rows named it
            name = f"task {row.id} (key {job.key})"
            n, delay = job.payload["n"], job.payload.get("delay")
            made = (row.payload.get("task"), row.payload.get("args"), row.owner_id)
            if made != (TASK_PATH, [n], job.user.pk):
                self.fail(f"{name}: payload {row.payload}, owner {row.owner_id}; expected {TASK_PATH}({n})")
            try:
                result = backend.get_result(str(row.id))
            except Exception as exc:  # noqa: BLE001 (a failure of the check)
                self.fail(f"{name}: get_result raised {exc!r}")
            else:
                if result.status != TaskResultStatus.SUCCESSFUL:
                    self.fail(f"{name}: get_result says {result.status}, errors {result.errors}")
                elif (result.return_value or {}).get("visits") != n:
                    self.fail(f"{name}: returned {result.return_value!r}, expected {n} visits")
            records = list(StageRecord.objects.filter(job=row))
            if [r.stage for r in records] != [RUN_STAGE] or records[0].finished_at is None:
                self.fail(f"{name}: stage records {[(r.stage, r.finished_at) for r in records]}")
            else:
                attempts += records[0].attempts
                resumed += records[0].attempts > 1
            if delay:
                if row.run_after is None or row.run_after <= row.accepted_at:
                    self.fail(
                        f"{name}: delayed {delay}s, but run_after {row.run_after} (accepted {row.accepted_at})"
                    )
                elif row.started_at is None or row.started_at < row.run_after:
                    self.fail(f"{name}: started at {row.started_at}, before its run_after {row.run_after}")
                else:
                    lags.append((row.started_at - row.run_after).total_seconds())
            elif row.run_after is not None:
                self.fail(f"{name}: not delayed, but run_after {row.run_after}")
        rows = JobRow.objects.filter(owner__username__startswith=self.run.prefix, domain=TASK_JOB).count()
        if rows != len(tasks):
            self.fail(f"{rows} task jobs for {len(tasks)} task keys")
        ids = [job.job_id for job in tasks if job.job_id]
        # How late the delayed tasks started: the sweeper's poll, or more when Redis was down.
        lag_range = {"min": round(min(lags), 2), "max": round(max(lags), 2)} if lags else {}
        sweeper_starts = re.findall(r"Started (\d+) delayed job\(s\) now due", self.run.stack.sweeper.log())
        self.figures["tasks"] = {
            "keys": len(tasks),
            "delayed": sum(1 for job in tasks if job.payload.get("delay")),
            "task_jobs": rows,
            "runs_started": sum(self.runs_started.get(i, 0) for i in ids),
            "runs_to_completion": sum(self.runs_completed.get(i, 0) for i in ids),
            "stage_attempts": attempts,
            # A run resumed after its worker or pool was killed, or after its run was lost with
            # Redis (a restart, a failover) and the sweeper sent it again.
            "tasks_with_more_than_one_attempt": resumed,
            # Due runs the sweeper sent: the delayed tasks', and the durable jobs' resumptions.
            "due_runs_sent_by_the_sweeper": sum(int(count) for count in sweeper_starts),
            "start_after_run_after_s": lag_range,
        }

    # L1-L3: Redis --------------------------------------------------------------------------------

    def check_redis(self, jobs: list[Job]) -> None:
        from eventbus.bus.keys import JobKeys, dead_letter_key

        bus = self.run.topology.bus()
        try:
            entries: dict[str, list[dict]] = {}
            total = 0
            for stream in streams():
                for stream_id, fields in bus.xrange(stream.key, "-", "+"):
                    total += 1
                    entries.setdefault(fields.get("job_id"), []).append(
                        {**fields, "stream_id": stream_id, "stream": stream.key}
                    )
            # The keys' jobs, then the durable jobs' children: each with the seqs it must have published.
            streamed = [(job.job_id, job.domain, job.expected) for job in jobs if job.job_id]
            streamed += self.children
            ours = {job_id for job_id, _, _ in streamed}
            strangers = set(entries) - ours
            if strangers:
                self.fail(f"stream entries of unknown jobs: {sorted(strangers)[:5]}")
            dead = sum(bus.xlen(dead_letter_key(s.domain, s.shard)) for s in streams())
            pending = sum(pending_count(bus, s) for s in streams())
            if dead:
                self.fail(f"{dead} dead letter(s) (expected 0)")
            if pending:
                self.fail(f"{pending} stream entries still pending in the router group (expected 0)")
            for job_id, domain, expected in streamed:
                keys = JobKeys(domain, job_id)
                final_seq = expected[-1]
                got = entries.get(job_id, [])
                triples = [(e["job_id"], e["stage"], int(e["seq"])) for e in got]
                dups = {t for t in triples if triples.count(t) > 1}
                if dups:
                    self.fail(f"job {job_id}: the stream holds {sorted(dups)} more than once")
                seqs = [int(e["seq"]) for e in got]
                if seqs != expected:
                    self.fail(f"job {job_id}: stream seqs {seqs}, expected {expected}")
                prevs = [int(e["prev_seq"]) for e in got]
                if prevs != [0, *expected[:-1]] and seqs == expected:
                    self.fail(f"job {job_id}: stream prev_seqs {prevs}")
                state_raw = bus.get(keys.state)
                state = json.loads(state_raw) if state_raw else None
                final = next((e for e in got if int(e["seq"]) == final_seq), None)
                if (
                    state is None
                    or state.get("seq") != final_seq
                    or state.get("data", {}).get("state") != "COMPLETED"
                ):
                    self.fail(f"job {job_id}: state {state_raw!r} is not its final COMPLETED event")
                elif final is None or state.get("stream_id") != final["stream_id"]:
                    self.fail(
                        f"job {job_id}: state's stream id {state.get('stream_id')} is not the final "
                        f"entry's {final and final['stream_id']}"
                    )
                history = [int(score) for _, score in bus.zrange(keys.history, 0, -1, withscores=True)]
                if history != expected:
                    self.fail(f"job {job_id}: history seqs {history}, expected {expected}")
                applied = bus.get(keys.applied)
                if applied != str(final_seq):
                    self.fail(f"job {job_id}: applied seq {applied}, expected {final_seq}")
            self.figures["streams"] = {
                "entries": total,
                "dead_letters": dead,
                "pending": pending,
                "expected_events": sum(len(expected) for _, _, expected in streamed),
            }
        finally:
            bus.close()

    # L4: the watchers ---------------------------------------------------------------------------------

    def check_watchers(self, jobs: list[Job]) -> None:
        watches = connections = cuts_clean = cuts_abort = slow = errors = 0
        closes: dict[int, int] = {}
        for job in jobs:
            for watch in job.watches:
                watches += 1
                connections += watch.connections
                cuts_clean += watch.cuts_clean
                cuts_abort += watch.cuts_abort
                errors += len(watch.connect_errors)
                for code in watch.closes:
                    closes[code] = closes.get(code, 0) + 1
                slow += watch.closes.count(4008)
                name = f"job {job.job_id} watcher {watch.index}"
                if watch.seqs != job.expected:
                    self.fail(
                        f"{name} saw seqs {watch.seqs} over {watch.connections} connection(s) "
                        f"(events {watch.events}), expected {job.expected}"
                    )
                if watch.resets:
                    self.fail(f"{name} got reset frame(s) {watch.resets} (the history cannot have expired)")
                if watch.errors:
                    self.fail(f"{name} got error frame(s) {watch.errors}")
                if not watch.done:
                    self.fail(
                        f"{name} never got the final event (seqs {watch.seqs}, closes {watch.closes}, "
                        f"connect errors {watch.connect_errors[-3:]})"
                    )
                unexpected = [c for c in watch.closes if c not in (1000, 1001, 4008)]
                if unexpected:
                    self.fail(f"{name}: closed by the server with {unexpected}")
        self.figures["websockets"] = {
            "watchers": watches,
            "connections": connections,
            "reconnects": connections - watches,
            "cut_clean_close": cuts_clean,
            "cut_tcp_abort": cuts_abort,
            "server_close_codes": closes,
            "closed_4008_too_slow": slow,
            "connect_errors_retried": errors,
        }

    # Faults and counts -------------------------------------------------------------------------------

    def check_faults(self) -> None:
        for process in self.run.exited:
            self.fail(
                f"{process.name} exited by itself (code {process.process and process.process.returncode}):\n"
                f"{process.log()[-2000:]}"
            )
        faults = self.run.faults
        for kind in faults:
            if not faults[kind]:
                self.fail(f"fault {kind} was never injected")
        for kind in ("client_kill_normal", "client_kill_pubsub"):
            if faults[kind] and not sum(faults[kind]):
                self.fail(f"{kind}: no connection was killed")
        stack = self.run.stack
        if faults.get("network_stalls") and not any(s["connections_reset"] for s in faults["network_stalls"]):
            self.fail("network_stalls: no worker connection went through the proxy")
        if faults.get("backend_kills") and not any(k.get("web_mid_request") for k in faults["backend_kills"]):
            self.fail("backend_kills: no web server session was caught mid-request")
        if faults["daphne_kills"] and not any(kill["sockets_cut"] for kill in faults["daphne_kills"]):
            self.fail("daphne_kills: no socket was open on the web server killed")
        if faults["client_kill_pubsub"] and "gateway hub reconnected to Redis" not in stack.web_logs():
            self.fail("CLIENT KILL TYPE pubsub missed the gateway hub (it never reconnected)")
        self.figures["kills_survived"] = {
            "router_sigkills": len(faults["router_kills"]),
            "router_sigkills_holding_entries": sum(1 for kill in faults["router_kills"] if kill["held"]),
            "worker_sigkills_mid_job": len(faults["worker_kills"]),
            "pool_sigkills_mid_job": len(faults["pool_kills"]),
            "client_kill_normal_connections": sum(faults["client_kill_normal"]),
            "client_kill_pubsub_connections": sum(faults["client_kill_pubsub"]),
            "gateway_hub_reconnections": stack.web_logs().count("gateway hub reconnected to Redis"),
            "gateway_hub_channels_followed_to_a_new_master": stack.web_logs().count(
                "moved to their new master"
            ),
            "daphne_sigkills_mid_stream": len(faults.get("daphne_kills", ())),
            "sockets_cut_by_daphne_kills": sum(k["sockets_cut"] for k in faults.get("daphne_kills", ())),
            "redis_sigkills_restarted_from_aof": len(faults.get("redis_restarts", ())),
            "worker_network_stalls": len(faults.get("network_stalls", ())),
            "worker_connections_reset": sum(s["connections_reset"] for s in faults.get("network_stalls", ())),
            "failovers": len(faults.get("failovers", ())),
            "postgres_backend_kills": len(faults.get("backend_kills", ())),
            "postgres_sessions_ended": {
                name: sum(k.get(name, 0) for k in faults.get("backend_kills", ()))
                for name in sorted({name for k in faults.get("backend_kills", ()) for name in k})
            },
        }

    def count_layers(self) -> None:
        totals: dict[str, float] = {}
        for samples in self.run.metrics.values():
            for (name, labels), value in samples.items():
                labels = dict(labels)
                key = name if "layer" not in labels else f"{name}{{layer={labels['layer']}}}"
                totals[key] = totals.get(key, 0) + value
        web = self.web_metrics
        self.figures["layers"] = {
            "L0_idempotency_requests": web,
            "L1_events_published": self.figures.get("streams", {}).get("entries"),
            "L1_duplicates_dropped": self.l1_duplicates,
            # Scraped every 0.5 s from each router incarnation and the reclaimer: a router's
            # counts since its last scrape die with it, so these are lower bounds.
            "L2_applied_at_least": int(totals.get("eventbus_applied_total", 0)),
            "L2_duplicates_dropped_at_least": int(totals.get("eventbus_duplicates_total{layer=L2}", 0)),
            "L2_deferred_at_least": int(totals.get("eventbus_deferred_total", 0)),
            "reclaimed_entries": int(totals.get("event_router_reclaim_messages_total", 0)),
            "dead_letters_metric": int(totals.get("eventbus_dead_letters_total", 0)),
        }

    def report(self) -> str:
        run = self.run
        lines = [
            f"exactly-once chaos run: {len(run.jobs)} jobs, {len(run.users)} clients, duration "
            f"{run.config.duration:g}s, {run.redis_kind}, "
            f"seed {run.seed}",
        ]
        for name, value in self.figures.items():
            lines.append(f"  {name}: {json.dumps(value, sort_keys=False)}")
        if self.failures:
            lines.append(f"FAILED: {len(self.failures)} violation(s)")
            lines.extend(f"  - {failure}" for failure in self.failures[:50])
            if len(self.failures) > 50:
                lines.append(f"  ... and {len(self.failures) - 50} more")
            stack = run.stack
            logs = [*stack.webs, *stack.workers, *stack.all_routers, stack.reclaimer, stack.sweeper]
            lines.append("process logs: " + " ".join(str(p.log_path) for p in logs))
        else:
            lines.append("PASSED: every guarantee held")
        return "\n".join(lines)


def _count(pattern: str, text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for match in re.finditer(pattern, text, re.MULTILINE):
        counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    return counts


def run_chaos(config: ChaosConfig) -> Result:
    """Start the stack, run the workload under faults, check; every process stopped at the end."""
    return Run(config).execute()
