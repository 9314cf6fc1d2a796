"""The Redis client of the event bus: one per process and thread-safe (redis-py pools)."""

from __future__ import annotations

import threading
from typing import Any

import redis
from django.conf import settings
from django.core.signals import setting_changed

from eventbus.conf import eventbus_settings
from eventbus.redis.sentinel import parse_sentinel_url

# Where the bus looks when the project names no Redis: a local server, as redis-py does.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

_lock = threading.Lock()
_client = None


def redis_url() -> str:
    """The bus's Redis: EVENTBUS["REDIS_URL"], else the project's REDIS_URL setting, else a local
    server. The apps read no other project setting for it, so any project can point them at its
    Redis with either name (the gateway's hub uses the same URL)."""
    return eventbus_settings.REDIS_URL or getattr(settings, "REDIS_URL", None) or DEFAULT_REDIS_URL


def sentinel_url():
    """The redis+sentinel:// URL's parts when redis_url() is one (eventbus.redis.sentinel), else None."""
    parsed = parse_sentinel_url(redis_url())
    if parsed is not None and eventbus_settings.CLUSTER:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            'A Redis Cluster is not Sentinel-managed: EVENTBUS["CLUSTER"] takes a redis:// URL.'
        )
    return parsed


def publish_command() -> str:
    """How the router publishes a job's event: SPUBLISH on a Redis Cluster (sharded pub/sub: the
    shard's master alone carries it, where PUBLISH is copied to every node), else PUBLISH."""
    return "SPUBLISH" if eventbus_settings.CLUSTER else "PUBLISH"


_wait_replicas: int | None = None


def wait_replicas() -> int:
    """EVENTBUS["WAIT_REPLICAS"], its default resolved: 1 under Sentinel, else 0 (read at
    every publish: kept until the settings change)."""
    global _wait_replicas
    if _wait_replicas is None:
        _wait_replicas = _configured_wait_replicas()
    return _wait_replicas


def _configured_wait_replicas() -> int:
    configured = eventbus_settings.WAIT_REPLICAS
    if configured is None:
        return 1 if sentinel_url() is not None else 0
    return int(configured)


def get_redis():
    """A client for redis_url(): a redis.Redis, or a RedisCluster when EVENTBUS['CLUSTER'], or
    a client of the Sentinel-managed master of a redis+sentinel:// URL."""
    global _client
    if _client is None:
        with _lock:
            if _client is None:
                _client = make_redis()
    return _client


def make_redis(*, client_name: str | None = None):
    """A new client for redis_url() (get_redis() shares one); a named one shows in CLIENT LIST."""
    if (sentinel := sentinel_url()) is not None:
        from redis.sentinel import Sentinel

        return sentinel.master_for(Sentinel, redis.Redis, client_name=client_name)
    if eventbus_settings.CLUSTER:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(redis_url(), client_name=client_name)
    return redis.Redis.from_url(redis_url(), client_name=client_name)


def make_async_redis():
    """A new redis.asyncio client (bound to the event loop that uses it: the caller closes it)."""
    if (sentinel := sentinel_url()) is not None:
        return _async_master(sentinel)
    if eventbus_settings.CLUSTER:
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(redis_url())
    import redis.asyncio

    return redis.asyncio.Redis.from_url(redis_url())


def make_async_node_client(host: str | None = None, port: int | None = None):
    """A plain redis.asyncio client of one server: the one REDIS_URL names (or the master the
    sentinels name), or a cluster's node at host:port (with REDIS_URL's credentials). The
    gateway's pub/sub connections."""
    if (sentinel := sentinel_url()) is not None:
        return _async_master(sentinel)
    import redis.asyncio

    if host is None:
        return redis.asyncio.Redis.from_url(redis_url())
    from redis.asyncio.connection import parse_url

    options: dict[str, Any] = {**parse_url(redis_url()), "host": host, "port": port, "db": 0}
    return redis.asyncio.Redis(**options)


def make_async_read_client(*, max_connections: int):
    """A redis.asyncio client for many concurrent short reads (the gateway's backfills): at
    most `max_connections`, and a burst of readers queues for one instead of failing at the
    pool's limit (a reconnect resyncs every socket at once). A cluster client in cluster mode;
    with Sentinel, a client of the master whose pool follows failovers (not a blocking one)."""
    if eventbus_settings.CLUSTER or sentinel_url() is not None:
        return make_async_redis()
    import redis.asyncio

    pool = redis.asyncio.BlockingConnectionPool.from_url(
        redis_url(), max_connections=max_connections, timeout=None
    )
    return redis.asyncio.Redis(connection_pool=pool)


def _async_master(sentinel):
    import redis.asyncio
    from redis.asyncio.sentinel import Sentinel

    return sentinel.master_for(Sentinel, redis.asyncio.Redis)


def is_cluster(client) -> bool:
    """Cluster clients cannot read streams of several slots in one command."""
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    return isinstance(client, (RedisCluster, AsyncRedisCluster))


def by_node(client, keys) -> list[tuple[Any, list[int]]]:
    """The positions of these keys grouped by the cluster node that owns each one's slot, as
    the cluster client's slot map says: (node, positions), a node once."""
    groups: dict[str, tuple[Any, list[int]]] = {}
    for i, key in enumerate(keys):
        node = client.get_node_from_key(key)
        groups.setdefault(node.name, (node, []))[1].append(i)
    return list(groups.values())


def reset_redis(**kwargs):
    """Drop the client (settings changed, or after a fork)."""
    global _client, _wait_replicas
    _wait_replicas = None
    with _lock:
        if _client is not None:
            _client.close()
        _client = None


def _on_setting_changed(*, setting, **kwargs):
    if setting in ("REDIS_URL", "EVENTBUS"):
        reset_redis()


setting_changed.connect(_on_setting_changed)
