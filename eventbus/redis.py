"""The Redis client of the event bus: one per process and thread-safe (redis-py pools)."""

from __future__ import annotations

import threading

import redis
from django.conf import settings
from django.core.signals import setting_changed

from .conf import eventbus_settings

_lock = threading.Lock()
_client = None


def get_redis():
    """A client for REDIS_URL: a redis.Redis, or a RedisCluster when EVENTBUS['CLUSTER']."""
    global _client
    if _client is None:
        with _lock:
            if _client is None:
                _client = make_redis()
    return _client


def make_redis(*, client_name: str | None = None):
    """A new client for REDIS_URL (get_redis() shares one); a named one shows in CLIENT LIST."""
    if eventbus_settings.CLUSTER:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(settings.REDIS_URL, client_name=client_name)
    return redis.Redis.from_url(settings.REDIS_URL, client_name=client_name)


def make_async_redis():
    """A new redis.asyncio client (bound to the event loop that uses it: the caller closes it)."""
    if eventbus_settings.CLUSTER:
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(settings.REDIS_URL)
    import redis.asyncio

    return redis.asyncio.Redis.from_url(settings.REDIS_URL)


def is_cluster(client) -> bool:
    """Cluster clients cannot read streams of several slots in one command."""
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    return isinstance(client, (RedisCluster, AsyncRedisCluster))


def reset_redis(**kwargs):
    """Drop the client (settings changed, or after a fork)."""
    global _client
    with _lock:
        if _client is not None:
            _client.close()
        _client = None


def _on_setting_changed(*, setting, **kwargs):
    if setting in ("REDIS_URL", "EVENTBUS"):
        reset_redis()


setting_changed.connect(_on_setting_changed)
