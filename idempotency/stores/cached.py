"""The database store with a cache in front: a replay of a completed record is served from
the cache without a database query. A request that stores an answer puts it in the cache once
its transaction has committed (a retry usually follows a lost answer closely, so even the first
replay of a key is served from the cache); a replay the database answered (the cache was down,
flushed, or the entry evicted) puts it back. So the cache never holds an answer the database
has not committed, and an entry lives no longer than its record.
"""

from __future__ import annotations

import hashlib
import logging

from django.core.cache import caches
from django.db import router, transaction

from ..conf import idempotency_settings
from ..models import IdempotencyRecord
from ..responses import StoredResponse
from .base import Acquisition, Outcome
from .db import DatabaseStore

logger = logging.getLogger(__name__)


class CachedStore(DatabaseStore):
    cache_prefix = "idempotency:"

    @property
    def cache(self):
        return caches[idempotency_settings.CACHE_ALIAS]

    def cache_key(self, scope: str, key: str) -> str:
        # Hashed: keys may hold characters some cache backends refuse.
        return self.cache_prefix + hashlib.sha256(f"{scope}\0{key}".encode()).hexdigest()

    def cached(self, *, scope, key, fingerprint):
        entry = self._cache_call("get", scope, key)
        if entry is None or entry["expires"] <= self.now().timestamp():
            return None
        if entry["fingerprint"] != fingerprint:
            return Acquisition(Outcome.MISMATCH)
        response = StoredResponse(entry["status"], tuple(map(tuple, entry["headers"])), entry["body"])
        return Acquisition(Outcome.REPLAY, response=response)

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

    def record_answer(self, claim, response, *, last=False):
        if not super().record_answer(claim, response, last=last):
            return False
        if response is not None:
            self._remember_on_commit(claim.lease, response, claim.using)
        return True

    def complete(self, lease, response):
        if not super().complete(lease, response):
            return False
        self._remember_on_commit(lease, response, router.db_for_write(IdempotencyRecord))
        return True

    def _remember_on_commit(self, lease, response, using):
        # At once outside a transaction; after the COMMIT inside one (never on a rollback).
        transaction.on_commit(
            lambda: self._remember(lease.scope, lease.key, lease.fingerprint, response, lease.expires_at),
            using=using,
        )

    def _remembered(self, acquisition, scope, key, fingerprint):
        if acquisition.outcome is Outcome.REPLAY:
            self._remember(scope, key, fingerprint, acquisition.response, acquisition.expires_at)
        return acquisition

    def evict(self, *, scope, key):
        super().evict(scope=scope, key=key)
        self.forget(scope=scope, key=key)

    def forget(self, *, scope, key) -> None:
        self._cache_call("delete", scope, key)

    def _remember(self, scope, key, fingerprint, response, expires_at):
        expires = expires_at.timestamp()
        timeout = int(expires - self.now().timestamp())
        if timeout <= 0:
            return
        entry = {
            "fingerprint": fingerprint,
            "expires": expires,
            "status": response.status,
            "headers": [list(h) for h in response.headers],
            "body": response.body,
        }
        self._cache_call("set", scope, key, entry, timeout)

    def _cache_call(self, method, scope, key, *args):
        # A cache alias that is not configured is an error (checks: idempotency.E007), not a miss.
        cache = self.cache
        # The cache is an optimisation: when it fails, the database answers.
        try:
            return getattr(cache, method)(self.cache_key(scope, key), *args)
        except Exception:
            logger.warning("idempotency cache %s failed; the database answers", method, exc_info=True)
            return None
