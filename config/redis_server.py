"""Start and stop a private redis-server: the one `make run` and the test suite use when
REDIS_URL is unset. It is the system's redis-server, and only one without the 2025 Lua
use-after-free (CVE-2025-49844, remote code execution): an upstream release that has the fix, or
a Debian/Ubuntu package whose changelog lists it (redis_server_check). `make run`'s and the
suite's servers have a random password of their own per start (RedisServer(password=...)).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from config.private_files import private_dir, write_private_file
from config.redis_server_check import find_redis_server

__all__ = ["RedisServer", "RedisClusterServers", "env_or_private", "find_redis_server", "free_port"]


def new_password() -> str:
    return secrets.token_urlsafe(24)


_handed_out: set[int] = set()


def free_port() -> int:
    """A port free now, and never one this process was given before: the kernel may hand the
    same free port to two binds in a row, and two servers started on it would be one (the
    second fails to bind, and the first answers for both)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


# A durable store, as the event bus needs one (docs/design/durability.md, "Durability and recovery"): every write
# in the append-only file, flushed every second, and never an evicted key (an evicted dedup key
# silently lets a duplicate through).
DURABLE_ARGS = ("--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "noeviction")
EPHEMERAL_ARGS = ("--appendonly", "no")


class RedisServer:
    """One redis-server process on 127.0.0.1 and a free port, stopped with `stop()`. `durable`
    keeps its data in `data_dir` across restarts (AOF); the test suite's servers need not.
    `password`: required of every client (requirepass, and masterauth for a replica), written to
    the server's config file (mode 0600, in its 0700 data folder) rather than its command line,
    which any local user can read; `url` carries it."""

    CONFIG_FILE = "redis.conf"

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: str | Path | None = None,
        args: tuple = (),
        durable: bool = False,
        password: str | None = None,
    ):
        self.port = port or free_port()
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="redis-")
        self.data_dir = Path(data_dir) if data_dir else Path(self._tmp.name)  # type: ignore[union-attr]
        self.args = (*(DURABLE_ARGS if durable else EPHEMERAL_ARGS), *args)
        self.password = password
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self, **kwargs) -> redis.Redis:
        """A client of this server (with its password)."""
        return redis.Redis(port=self.port, password=self.password, **kwargs)

    def _config_file(self) -> Path:
        """The config file the server reads first: its password, which must stay off its command line."""
        lines = ["bind 127.0.0.1", "protected-mode yes"]
        if self.password:
            lines += [f"requirepass {self.password}", f"masterauth {self.password}"]
        return write_private_file(self.data_dir / self.CONFIG_FILE, "\n".join(lines) + "\n")

    def start(self, timeout: float = 10.0) -> RedisServer:
        private_dir(self.data_dir)
        command = [
            find_redis_server(),
            str(self._config_file()),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--logfile",
            str(self.data_dir / "redis.log"),
            *self.args,
        ]
        # Its own session: a Ctrl-C aimed at the foreground processes does not reach it,
        # so it outlives them and is stopped last, by us.
        self.process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL)
        client = self.client(socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        while True:
            try:
                # Ours, not another server that took the port first (ours then exits).
                if client.info("server")["process_id"] == self.process.pid:
                    return self
            except redis.RedisError:  # not up yet, or another server (another password) on the port
                pass
            finally:
                client.close()
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = self.data_dir / "redis.log"
                detail = log.read_text()[-2000:] if log.exists() else ""
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}: {detail}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL, as a crash: its data stays in `data_dir` for `start()` to load again."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self._tmp:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def env_or_private(data_dir: Path) -> tuple[str, RedisServer | None]:
    """REDIS_URL when set; otherwise a private, durable server started now on the data it kept
    in `data_dir`, with a new password (the caller stops it)."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url, None
    server = RedisServer(data_dir=data_dir, durable=True, password=new_password()).start()
    return server.url, server


CLUSTER_ARGS = (
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "2000",
)
CLUSTER_SLOTS = 16384


def cluster_port(rng=None) -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    import random

    rng = rng or random
    for _ in range(200):
        port = rng.randint(20000, 55535)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


class RedisClusterServers:
    """A private Redis Cluster of `masters` nodes, each with `replicas` replicas: what
    `redis-cli --cluster create --cluster-replicas N` builds, done through redis-py so that no
    redis-cli is needed."""

    def __init__(self, masters: int = 3, *, replicas: int = 0, rng=None, args: tuple[str, ...] = ()):
        self.masters = masters
        self.replicas = replicas
        self.rng = rng
        self.args = args
        self.nodes: list[RedisServer] = []  # the masters at creation
        self.replica_nodes: list[RedisServer] = []

    @property
    def url(self) -> str:
        """Any node's URL names the cluster."""
        return self.nodes[0].url

    @property
    def servers(self) -> list[RedisServer]:
        return [*self.nodes, *self.replica_nodes]

    def start(self, timeout: float = 30) -> RedisClusterServers:
        try:
            for _ in range(self.masters):
                self.nodes.append(self._node())
            for _ in range(self.masters * self.replicas):
                self.replica_nodes.append(self._node())
            self._create(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _node(self) -> RedisServer:
        return RedisServer(port=cluster_port(self.rng), args=(*CLUSTER_ARGS, *self.args)).start()

    def _create(self, timeout: float) -> None:
        clients = [redis.Redis(port=node.port) for node in self.servers]
        try:
            masters = clients[: self.masters]
            step = CLUSTER_SLOTS // len(masters)
            for i, client in enumerate(masters):
                end = CLUSTER_SLOTS if i == len(masters) - 1 else (i + 1) * step
                client.execute_command("CLUSTER ADDSLOTS", *range(i * step, end))
            # A config epoch of its own for each node, as redis-cli gives them: left at 0, the
            # nodes settle the collision over the bus a moment later, and a slot moved meanwhile
            # can end up claimed by no master (eventbus.redis.placement._settle).
            for epoch, client in enumerate(clients, start=1):
                client.execute_command("CLUSTER SET-CONFIG-EPOCH", epoch)
            for client in clients[1:]:
                client.execute_command("CLUSTER MEET", "127.0.0.1", self.nodes[0].port)
            # Every node knows every node, and its epoch.
            epochs = {str(epoch) for epoch in range(1, len(clients) + 1)}
            self._wait(
                clients, timeout, lambda c: {n["epoch"] for n in c.cluster("nodes").values()} == epochs
            )
            ids = [_text(client.execute_command("CLUSTER MYID")) for client in masters]
            for i, client in enumerate(clients[self.masters :]):
                client.execute_command("CLUSTER REPLICATE", ids[i % self.masters])
            self._wait(clients, timeout, lambda c: c.cluster("info").get("cluster_state") == "ok")
            for client in clients[self.masters :]:
                self._wait(
                    [client], timeout, lambda c: c.info("replication").get("master_link_status") == "up"
                )
        finally:
            for client in clients:
                client.close()

    @staticmethod
    def _wait(clients, timeout: float, ready) -> None:
        deadline = time.monotonic() + timeout
        while not all(ready(client) for client in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("Redis Cluster did not come up (cluster_state, replication)")
            time.sleep(0.05)

    def roles(self) -> dict[int, str]:
        """Port -> "master" or "slave", as each node says now."""
        found = {}
        for node in self.servers:
            with redis.Redis(port=node.port, socket_timeout=5) as client:
                found[node.port] = client.info("replication")["role"]
        return found

    def failover(self, master_port: int, timeout: float = 30) -> int:
        """CLUSTER FAILOVER: a replica of this master takes its place (the master stops taking
        writes, the replica catches up, then is promoted); the new master's port once every node
        agrees and the cluster is ok again."""
        with redis.Redis(port=master_port, socket_timeout=5) as master:
            master_id = _text(master.execute_command("CLUSTER MYID"))
        replica = next(node for node in self.servers if _replica_of(node.port) == master_id)
        deadline = time.monotonic() + timeout
        with redis.Redis(port=replica.port, socket_timeout=5) as client:
            # The masters vote for one replica of a master per 2 x cluster-node-timeout: a
            # failover soon after another may be refused; the replica asks again.
            while client.info("replication")["role"] != "master":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"CLUSTER FAILOVER of :{master_port} did not happen")
                client.execute_command("CLUSTER FAILOVER")
                try:
                    self._wait([client], 6, lambda c: c.info("replication")["role"] == "master")
                except RuntimeError:
                    continue
            clients = [redis.Redis(port=node.port, socket_timeout=5) for node in self.servers]
            try:
                self._wait(
                    clients,
                    timeout,
                    lambda c: (
                        c.cluster("info").get("cluster_state") == "ok" and _owner_of_slots(c, replica.port)
                    ),
                )
                # The demoted master follows its replica, and is one again for the next failover.
                self._wait(
                    [c for c in clients if c.connection_pool.connection_kwargs["port"] == master_port],
                    timeout,
                    lambda c: c.info("replication").get("master_link_status") == "up",
                )
            finally:
                for c in clients:
                    c.close()
        return replica.port

    def stop(self) -> None:
        for node in self.servers:
            node.stop()
        self.nodes, self.replica_nodes = [], []


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _replica_of(port: int) -> str | None:
    """The id of the master this node replicates, or None for a master."""
    with redis.Redis(port=port, socket_timeout=5) as client:
        nodes = client.cluster("nodes")  # redis-py parses it: address -> fields
    myself = next(node for node in nodes.values() if "myself" in node["flags"])
    return myself["master_id"] if "slave" in myself["flags"] else None


def _owner_of_slots(client, port: int) -> bool:
    """Whether this node's view of the cluster has the master on `port` owning slots."""
    for address, node in client.cluster("nodes").items():
        if address.endswith(f":{port}"):
            return "master" in node["flags"] and bool(node["slots"])
    return False
