"""A real Sentinel-managed Redis for the tests: 1 master, 1 replica and 3 sentinels on free
ports of 127.0.0.1 (redis-server in sentinel mode, as Debian's redis-sentinel runs it: the system
binary, as config.redis_server finds it), and a failover on demand."""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from config.redis_server import RedisServer, find_redis_server, free_port

MASTER_NAME = "bus"


class SentinelGroup:
    def __init__(self, *, sentinels: int = 3, quorum: int = 2, durable: bool = False, args: tuple = ()):
        """`durable`, `args`: as RedisServer's, for both servers (the chaos run's are durable)."""
        self._tmp = tempfile.TemporaryDirectory(prefix="sentinels-")
        self.root = Path(self._tmp.name)
        self.master = RedisServer(data_dir=self.root / "a", durable=durable, args=args)
        self.replica = RedisServer(data_dir=self.root / "b", durable=durable, args=args)
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.quorum = quorum
        self.sentinels: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def start(self) -> SentinelGroup:
        # A group that does not come up is stopped: a session fixture's failed setup has no
        # teardown, and its servers would outlive the test run.
        try:
            self.master.start()
            self.replica.args = (*self.replica.args, "--replicaof", "127.0.0.1", str(self.master.port))
            self.replica.start()
            for index in range(len(self.sentinel_ports)):
                self.sentinels.append(self._start_sentinel(index))
            try:
                self.wait(self._all_know_each_other, "the sentinels to find the replica and each other")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{self._diagnosis()}") from None
        except BaseException:
            self.stop()
            raise
        return self

    def _start_sentinel(self, index: int) -> subprocess.Popen:
        directory = self.root / f"sentinel-{index}"
        directory.mkdir(exist_ok=True)
        (directory / "sentinel.conf").write_text(
            f"port {self.sentinel_ports[index]}\nbind 127.0.0.1\ndir {directory}\n"
            f"logfile {directory / 'sentinel.log'}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
            f"sentinel failover-timeout {MASTER_NAME} 5000\n"
        )
        return subprocess.Popen(
            [find_redis_server(), str(directory / "sentinel.conf"), "--sentinel"],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
        )

    def _restart_exited(self) -> None:
        """A sentinel that exited at start lost its port (free_port() chose it, and another
        process bound it before the sentinel did): it starts again on another."""
        for index, process in enumerate(self.sentinels):
            if process.poll() is not None:
                self.sentinel_ports[index] = free_port()
                self.sentinels[index] = self._start_sentinel(index)

    def _diagnosis(self) -> str:
        lines = []
        for index, process in enumerate(self.sentinels):
            log = self.root / f"sentinel-{index}" / "sentinel.log"
            tail = log.read_text().splitlines()[-8:] if log.exists() else []
            lines.append(f"sentinel {index} on :{self.sentinel_ports[index]}, exit code {process.poll()}:")
            lines.extend(f"  {line}" for line in tail)
        return "\n".join(lines)

    @property
    def servers(self) -> list[RedisServer]:
        return [self.master, self.replica]

    def sentinel(self, index: int = 0) -> redis.Redis:
        return redis.Redis(port=self.sentinel_ports[index], socket_timeout=2, decode_responses=True)

    def master_port(self, index: int = 0) -> int:
        with self.sentinel(index) as client:
            return int(client.sentinel_get_master_addr_by_name(MASTER_NAME)[1])

    def replica_port(self) -> int:
        """The port of the server that is not the master now."""
        master = self.master_port()
        return next(server.port for server in self.servers if server.port != master)

    def _server(self, port: int) -> RedisServer:
        return next(server for server in self.servers if server.port == port)

    def pause_replica(self) -> None:
        """SIGSTOP the replica: it acknowledges nothing until resume_replica()."""
        process = self._server(self.replica_port()).process
        assert process is not None
        process.send_signal(signal.SIGSTOP)

    def resume_replica(self) -> None:
        process = self._server(self.replica_port()).process
        assert process is not None
        process.send_signal(signal.SIGCONT)

    def _all_know_each_other(self) -> bool:
        self._restart_exited()
        for index in range(len(self.sentinel_ports)):
            try:
                with self.sentinel(index) as client:
                    replicas = client.sentinel_slaves(MASTER_NAME)
                    others = client.sentinel_sentinels(MASTER_NAME)
            except redis.RedisError:
                return False
            ready = [r for r in replicas if "s_down" not in r.get("flags", "")]
            if not ready or len(others) < len(self.sentinel_ports) - 1:
                return False
        with redis.Redis(port=self.replica.port) as replica:
            return replica.info("replication").get("master_link_status") == "up"

    def failover(self) -> int:
        """SENTINEL FAILOVER: returns the new master's port once every sentinel names it and the
        old master is its replica (until then a client still on the old master writes there, and
        those writes are lost when it turns replica: the lost-writes case, not this one)."""
        old = self.master_port()
        with self.sentinel() as client:
            client.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)

        def moved() -> bool:
            if any(self.master_port(i) == old for i in range(len(self.sentinel_ports))):
                return False
            with redis.Redis(port=self.master_port()) as new, redis.Redis(port=old) as demoted:
                demoted_role = demoted.info("replication")
                return (
                    new.info("replication")["role"] == "master"
                    and demoted_role["role"] == "slave"
                    and demoted_role.get("master_link_status") == "up"  # a replica again: WAIT answers
                )

        self.wait(moved, "the failover")
        return self.master_port()

    @staticmethod
    def wait(predicate, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if predicate():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.1)

    def stop(self) -> None:
        for process in self.sentinels:
            process.terminate()
        for process in self.sentinels:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        self.replica.stop()
        self.master.stop()
        self._tmp.cleanup()
