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
                if eventbus_settings.CLUSTER:
                    from redis.cluster import RedisCluster

                    _client = RedisCluster.from_url(settings.REDIS_URL)
                else:
                    _client = redis.Redis.from_url(settings.REDIS_URL)
    return _client


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
