"""Test-suite fixtures. A private redis-server, with a password of its own, runs for the whole
session (REDIS_URL, when set, points at an external one instead) and every Redis-using setting is
pointed at it."""

import os
from pathlib import Path

import pytest
import redis
from django.test.utils import override_settings

from config.redis_server import RedisServer, new_password
from config.settings.base import redis_cache


def pytest_sessionfinish(session, exitstatus):
    """The per-run SQLite test database's -wal and -shm files removed once the database itself is
    gone: connections left open by threads (race tests, sync_to_async) keep SQLite from removing
    them, and RUN_DIR filled up with them. Runs after every fixture's teardown, so after
    pytest-django dropped the database; a kept database (--reuse-db) keeps its files."""
    from django.conf import settings

    if not settings.configured:
        return
    database = settings.DATABASES["default"]
    name = database.get("TEST", {}).get("NAME")
    if database["ENGINE"] != "django.db.backends.sqlite3" or not name or Path(name).exists():
        return
    for suffix in ("-wal", "-shm", "-journal"):
        Path(f"{name}{suffix}").unlink(missing_ok=True)


def pytest_report_header(config):
    """Each leg of the version matrix (noxfile.py) says what it runs on."""
    import django

    from idempotency.adapters import ENVIRONMENT_VARIABLE, forced_off

    database = "PostgreSQL" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "SQLite"
    internals = "off (public APIs only)" if forced_off() else "on where the release is tested"
    return f"Django {django.get_version()} on {database}; library internals ({ENVIRONMENT_VARIABLE}): {internals}"


def pytest_terminal_summary(terminalreporter):
    """The path each adapter took in this process (idempotency.adapters): the matrix's proof that
    its public-API leg ran the fallbacks."""
    from idempotency.adapters import adapters_in_use

    used = adapters_in_use()
    if used:
        terminalreporter.write_line("adapters: " + ", ".join(f"{name}={path}" for name, path in used.items()))


@pytest.fixture(scope="session")
def private_redis():
    """The session's private server (None when REDIS_URL names one of yours)."""
    if os.environ.get("REDIS_URL"):
        yield None
        return
    server = RedisServer(password=new_password()).start()
    os.environ["REDIS_URL"] = server.url  # for processes the tests start
    try:
        yield server
    finally:
        server.stop()
        del os.environ["REDIS_URL"]


@pytest.fixture(scope="session", autouse=True)
def redis_url(private_redis):
    url = os.environ["REDIS_URL"]
    caches = {"default": redis_cache(url, "test-cache")}
    with override_settings(REDIS_URL=url, CACHES=caches, CELERY_BROKER_URL=url):
        yield url


@pytest.fixture(autouse=True)
def fresh_cache(redis_url):
    """Cached idempotent replays outlive a test's database rollback: start every test without them."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def redis_client(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("alice", password="pw-alice")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create_user("bob", password="pw-bob")


@pytest.fixture
def api_client(user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture(scope="session")
def sentinel_group():
    """A Sentinel-managed Redis (1 master, 1 replica, 3 sentinels), started on first use."""
    from tests.sentinels import SentinelGroup

    group = SentinelGroup().start()
    yield group
    group.stop()


@pytest.fixture
def sentinel_bus(sentinel_group, settings):
    """The bus on the Sentinel-managed master (a redis+sentinel:// URL), flushed. Yields the group."""
    with redis.Redis(port=sentinel_group.master_port()) as master:
        master.flushall()
    # The replica's acknowledgement can take longer than the default 500 ms on a busy machine
    # (a CI run); the tests that expect NotReplicated set their own timeout.
    settings.EVENTBUS = {**settings.EVENTBUS, "REDIS_URL": sentinel_group.url, "WAIT_TIMEOUT_MS": 5000}
    return sentinel_group


@pytest.fixture(scope="session", autouse=True)
def no_connection_left_behind(django_db_setup, django_db_blocker):
    """At the end, PostgreSQL's other sessions on the test database are ended, so that it can
    be dropped: async tests' sync_to_async threads keep a connection each, and PostgreSQL
    refuses to drop a database in use (the test database would stay behind)."""
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def skip_without_cluster_client() -> None:
    """The bus refuses a cluster with a redis-py older than 8.0 (eventbus.E010): the matrix's
    oldest leg (redis-py 5.0.1) has no cluster to test."""
    from eventbus.checks import CLUSTER_REDIS_PY
    from idempotency.adapters import installed

    release = installed("redis")
    if release is not None and release < CLUSTER_REDIS_PY:
        pytest.skip(f"eventbus.E010: a Redis Cluster needs redis-py >= 8.0, this leg has {release}")


@pytest.fixture(scope="session")
def redis_cluster_nodes():
    """A real 3-master Redis Cluster, started on first use, once per session."""
    from config.redis_server import RedisClusterServers

    skip_without_cluster_client()

    servers = RedisClusterServers(3).start()
    yield servers.nodes
    servers.stop()


@pytest.fixture
def cluster(redis_cluster_nodes):
    """The bus on the cluster (EVENTBUS['CLUSTER']); every master flushed. Yields a RedisCluster."""
    from redis.cluster import RedisCluster

    for node in redis_cluster_nodes:
        with node.client() as client:
            client.flushall()
    from django.conf import settings

    eventbus = {**getattr(settings, "EVENTBUS", {}), "CLUSTER": True}
    with override_settings(REDIS_URL=redis_cluster_nodes[0].url, EVENTBUS=eventbus):
        client = RedisCluster.from_url(redis_cluster_nodes[0].url)
        yield client
        client.close()


@pytest.fixture
def own_cluster(settings):
    """A 3-master Redis Cluster of the test's own (for a test that reshards it), the bus on it.
    Yields (RedisClusterServers, RedisCluster)."""
    yield from _own_cluster(settings, replicas=0)


@pytest.fixture
def replicated_cluster(settings):
    """A 3-master Redis Cluster with a replica per master, of the test's own (to fail it over)."""
    yield from _own_cluster(settings, replicas=1)


def _own_cluster(settings, *, replicas: int):
    from redis.cluster import RedisCluster

    from config.redis_server import RedisClusterServers

    skip_without_cluster_client()

    servers = RedisClusterServers(3, replicas=replicas).start()
    settings.REDIS_URL = servers.url
    settings.EVENTBUS = {**settings.EVENTBUS, "REDIS_URL": servers.url, "CLUSTER": True}
    client = RedisCluster.from_url(servers.url)
    yield servers, client
    client.close()
    servers.stop()
