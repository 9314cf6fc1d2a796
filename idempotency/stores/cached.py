"""The database store with a cache in front: a replay of a completed record is served from
the cache without a database query. The cache is filled by the replays the database answers:
the first replay of a key reads its record (one query, as without the cache) and puts the
answer in the cache for the next ones, as after a flush, an eviction or the cache being down.
A first request writes nothing to the cache (docs/reference/idempotency.md: the layer adds the key's lock-and-read
and the replay check to it, no more). The cache never holds an answer the database has not
committed (it is read from a committed record), and an entry lives no longer than its record.

The cache is a django-redis one, used through its raw redis-py client (django_redis's
`get_redis_connection`): entries are signed JSON bytes (entries.py), written and read with
plain SET and GET that never pass through the cache's serializer, which unpickles. Any other
cache backend is refused (checks: idempotency.E008): they all pickle what they store.
"""

from __future__ import annotations

import hashlib
import logging

from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django_redis import get_redis_connection

from ..conf import idempotency_settings
from . import entries
from .base import Acquisition, Outcome
from .db import DatabaseStore

logger = logging.getLogger(__name__)
SUPPORTED_BACKEND = "django_redis.cache.RedisCache"


def unsupported_backend(alias: str, backend: str) -> str:
    return (
        f"IDEMPOTENCY['CACHE_ALIAS'] is {alias!r}, whose backend {backend} is not supported by "
        f"idempotency.stores.cached.CachedStore: it needs {SUPPORTED_BACKEND} (django-redis) or a "
        "subclass, whose raw Redis client stores the signed answers as bytes (other backends "
        "unpickle what they read)."
    )


class CachedStore(DatabaseStore):
    # v2: signed JSON (entries.py). Pickled entries of earlier versions are never read.
    cache_prefix = "idempotency:v2:"

    def cache_key(self, scope: str, key: str) -> str:
        """The entry's name before the cache's KEY_PREFIX and version (`cache.make_key`)."""
        # Hashed: keys may hold characters some cache backends refuse.
        return self.cache_prefix + hashlib.sha256(f"{scope}\0{key}".encode()).hexdigest()

    def cached(self, *, scope, key, fingerprint):
        entry = self._read(scope, key)
        if entry is None or entry.expires <= self.now().timestamp():
            return None
        if entry.fingerprint != fingerprint:
            return Acquisition(Outcome.MISMATCH)
        return Acquisition(Outcome.REPLAY, response=entry.response)

    def acquire(self, *, scope, key, fingerprint, lease_seconds, ttl_seconds, method="", path=""):
        if (known := self.cached(scope=scope, key=key, fingerprint=fingerprint)) is not None:
            return known
        acquisition = super().acquire(
            scope=scope,
            key=key,
            fingerprint=fingerprint,
            lease_seconds=lease_seconds,
            ttl_seconds=ttl_seconds,
            method=method,
            path=path,
        )
        return self._remembered(acquisition, scope, key, fingerprint)

    def claim(self, *, scope, key, fingerprint, ttl_seconds, method="", path="", using):
        acquisition = super().claim(
            scope=scope,
            key=key,
            fingerprint=fingerprint,
            ttl_seconds=ttl_seconds,
            method=method,
            path=path,
            using=using,
        )
        return self._remembered(acquisition, scope, key, fingerprint)

    def _remembered(self, acquisition, scope, key, fingerprint):
        if acquisition.outcome is Outcome.REPLAY:
            self._remember(scope, key, fingerprint, acquisition.response, acquisition.expires_at)
        return acquisition

    def evict(self, *, scope, key):
        super().evict(scope=scope, key=key)
        self.forget(scope=scope, key=key)

    def forget(self, *, scope, key) -> None:
        client, name = self._redis(scope, key, write=True)
        self._safely("delete", client.delete, name)

    def _remember(self, scope, key, fingerprint, response, expires_at):
        expires = expires_at.timestamp()
        timeout = int(expires - self.now().timestamp())
        if timeout <= 0:
            return
        client, name = self._redis(scope, key, write=True)
        entry = entries.dumps(name, entries.Entry(fingerprint, expires, response))
        self._safely("set", client.set, name, entry, ex=timeout)

    def _read(self, scope, key) -> entries.Entry | None:
        client, name = self._redis(scope, key, write=False)
        raw = self._safely("get", client.get, name)
        if raw is None:
            return None
        try:
            return entries.loads(name, raw)
        except entries.BadEntry as exc:
            # Never the entry itself in the log: it is whatever someone wrote into Redis.
            logger.warning(
                "idempotency cache entry %s ignored (%s): not one this server wrote for this key; "
                "the database answers",
                name,
                exc,
            )
            return None

    def _redis(self, scope, key, *, write: bool):
        """The cache's raw redis-py client (reads as django-redis's own: from a replica when
        it has some) and the entry's full name in it. A cache alias that is not configured, or
        not a django-redis one, is an error (checks: idempotency.E007, E008), not a miss."""
        alias = idempotency_settings.CACHE_ALIAS
        cache = caches[alias]
        try:
            client = get_redis_connection(alias, write=write)
        except NotImplementedError:
            backend = f"{type(cache).__module__}.{type(cache).__qualname__}"
            raise ImproperlyConfigured(unsupported_backend(alias, backend)) from None
        return client, cache.make_key(self.cache_key(scope, key))

    @staticmethod
    def _safely(command, call, *args, **kwargs):
        # The cache is an optimisation: when it fails, the database answers.
        try:
            return call(*args, **kwargs)
        except Exception:
            logger.warning("idempotency cache %s failed; the database answers", command, exc_info=True)
            return None
