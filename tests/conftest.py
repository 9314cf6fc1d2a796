"""Test-suite fixtures, and the tiers (pyproject.toml's markers).

A test says what it needs by its markers: `redis` (the private redis-server), `processes`
(a Celery worker, a router, a server: tests/processes.py), `cluster`, `sentinel`, `browser`,
`stack` (`make run`'s whole stack), `chaos`, `postgres`. The fixtures that bring such a thing
mark the tests that use them (NEEDS below), so most tests never name one. A test with none of
them is in the fast tier (`make test-fast`): it gets no Redis at all (REDIS_URL names a closed
port, the cache is in memory), and there a subprocess is refused, so a test that needs more
than it says fails instead of passing by luck.

The private redis-server, with a password of its own, starts on the first test that needs it and
runs for the rest of the session (REDIS_URL, when set, points at an external one instead); every
Redis-using setting is pointed at it for the tests that need it.
"""

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

    from exactly_once.internals import ENVIRONMENT_VARIABLE, forced_off

    database = "PostgreSQL" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "SQLite"
    internals = "off (public APIs only)" if forced_off() else "on where the release is tested"
    return f"Django {django.get_version()} on {database}; library internals ({ENVIRONMENT_VARIABLE}): {internals}"


def pytest_terminal_summary(terminalreporter):
    """The path each adapter took in this process (exactly_once.internals): the matrix's proof that
    its public-API leg ran the fallbacks."""
    from exactly_once.internals import adapters_in_use

    used = adapters_in_use()
    if used:
        terminalreporter.write_line("adapters: " + ", ".join(f"{name}={path}" for name, path in used.items()))


# What a test can need beyond Python and the database, as pyproject.toml's markers name it. Each
# of these but `postgres` brings the private Redis too (the processes, the stack and the chaos
# run on it; the cluster and Sentinel tests keep it for the cache and the broker).
NEEDS_REDIS = ("redis", "processes", "cluster", "sentinel", "browser", "stack", "chaos")

# The fixtures that bring one of them: a test using one (directly or through another fixture) is
# marked so, without saying it itself.
NEEDS = {
    "private_redis": ("redis",),
    "redis_url": ("redis",),
    "redis_client": ("redis",),
    "broker": ("redis",),
    "redis_cluster_nodes": ("cluster",),
    "own_cluster": ("cluster",),
    "replicated_cluster": ("cluster",),
    "sentinel_group": ("sentinel",),
    "browser": ("browser",),
}

# The tiers by how long their tests take, the longest first.
SLOWEST_FIRST = ("chaos", "stack", "fuzz", "sentinel", "browser", "processes", "cluster", "redis")

# Where a test without Redis is pointed: port 9 (discard), on which nothing listens, so a test
# that uses Redis without saying so is refused at once instead of reaching some other server.
NO_REDIS = "redis://127.0.0.1:9/0"
NO_REDIS_CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items):
    """Before the other plugins' turn: each test marked with what its fixtures need (-m then
    selects by it). After it: the longest first. With -n (pytest-xdist), the minutes-long chaos
    and stack tests then start at once on workers of their own while the short ones fill the
    others, instead of starting last on one worker. A module's tests stay together (their
    module-scoped fixtures start once), and within a tier pytest-django's order stays."""
    from django.db import connection

    on_postgresql = connection.vendor == "postgresql"
    for item in items:
        for name in item.fixturenames:
            for marker in NEEDS.get(name, ()):
                item.add_marker(marker)
        if any(item.get_closest_marker(name) for name in NEEDS_REDIS):
            item.add_marker("redis")  # the fast tier is -m "not redis"
        if item.get_closest_marker("chaos"):
            # One chaos run at a time: each is a whole stack under faults, timed against deadlines
            # (a POST answered within 60 s) that three at once on two cores would miss.
            item.add_marker(pytest.mark.xdist_group("chaos"))
        elif module_scoped(item):
            # -n --dist loadgroup (make test) runs them on one worker: one module fixture, not one a worker.
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        if item.get_closest_marker("postgres") and not on_postgresql:
            item.add_marker(pytest.mark.skip(reason="needs PostgreSQL: the suite's PostgreSQL leg runs it"))
    yield
    first: dict = {}
    for item in items:
        weight = next(
            (i for i, name in enumerate(SLOWEST_FIRST) if item.get_closest_marker(name)), len(SLOWEST_FIRST)
        )
        first[item.module] = min(weight, first.get(item.module, weight))
    items.sort(key=lambda item: first[item.module])


def module_scoped(item) -> bool:
    """Whether the test uses a fixture that starts once per module (a stack, a set of servers)."""
    fixtures = getattr(item, "_fixtureinfo", None)
    if fixtures is None:
        return False
    return any(d.scope == "module" for defs in fixtures.name2fixturedefs.values() for d in defs)


def needs_redis(item) -> bool:
    return item.get_closest_marker("redis") is not None


def refuse_subprocess(*args, **kwargs):
    raise RuntimeError(
        "A test without a tier marker started a subprocess: mark it with what it needs"
        " (@pytest.mark.processes, redis, ...: pyproject.toml's markers)"
    )


@pytest.fixture(autouse=True)
def tier(request, monkeypatch):
    """A marked test gets the private Redis; an unmarked one gets no Redis and no subprocess."""
    if needs_redis(request.node):
        request.getfixturevalue("redis_url")
        from django.core.cache import cache

        cache.clear()  # cached idempotent replays outlive a test's database rollback
        yield
        return
    import subprocess

    from django.conf import settings

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse_subprocess)
    # The toolkit's default store (the demo's CachedStore keeps replays in Redis: its tests are `redis`).
    idempotency = {**settings.IDEMPOTENCY, "STORE": "idempotency.stores.db.DatabaseStore"}
    with override_settings(
        REDIS_URL=NO_REDIS, CACHES=NO_REDIS_CACHES, CELERY_BROKER_URL=NO_REDIS, IDEMPOTENCY=idempotency
    ):
        from django.core.cache import cache

        cache.clear()
        yield


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


@pytest.fixture(scope="session")
def redis_url(private_redis):
    """The private Redis's URL, and the settings pointed at it from the first test that needs it
    to the end of the session (the tests without Redis override them again, test by test)."""
    url = os.environ["REDIS_URL"]
    caches = {"default": redis_cache(url, "test-cache")}
    with override_settings(REDIS_URL=url, CACHES=caches, CELERY_BROKER_URL=url):
        yield url


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
    from exactly_once.internals import installed

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
