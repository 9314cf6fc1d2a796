"""The jobs API's throttle: DRF's ScopedRateThrottle for the scope "jobs".

The rate is REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["jobs"] ("120/min": per user, or per
address for a request not authenticated), or DEFAULT_RATE when the project sets none: DRF's own
class would fail every request of a project without that key (ImproperlyConfigured, a 500).
None turns it off. A throttled request gets a 429 problem with Retry-After. While the cache is
unreachable, requests go through unthrottled (logged): the API keeps answering. An entry there
that does not decode (corrupt, or written by someone else) is logged and counted afresh: the
request goes through and its count replaces the entry.

The counts live in the default cache, in a store of their own (idempotency.throttling's
JSONHistory, which the idempotency layer's own throttle uses too): on django-redis
they are JSON text written and read with plain SET and GET through its raw Redis client, never
through the cache's serializer, which unpickles by default (a forged pickle there would run
code). On another backend they go through the cache's API as JSON text; Django's own Redis,
Memcached, database and file caches unpickle what they read: gateway.W001 warns of them.
"""

from __future__ import annotations

import logging

from rest_framework.settings import api_settings
from rest_framework.throttling import ScopedRateThrottle

from idempotency.throttling import CACHE_ERRORS, JSONHistory

SCOPE = "jobs"
DEFAULT_RATE = "120/min"
CACHE_ALIAS = "default"
# Backends whose store only this process writes, or that store nothing: nothing to forge there.
PRIVATE_BACKENDS = (
    "django.core.cache.backends.locmem.LocMemCache",
    "django.core.cache.backends.dummy.DummyCache",
)

logger = logging.getLogger(__name__)


class JobsThrottle(ScopedRateThrottle):
    def __init__(self):
        super().__init__()
        self.cache = JSONHistory(CACHE_ALIAS)  # per instance: the cache of the settings in force

    def get_rate(self):
        # Read per request, not DRF's class attribute frozen at import: settings overrides apply.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope, DEFAULT_RATE)

    def allow_request(self, request, view):
        # Open while the cache is down, as the idempotency layer falls back to the database:
        # the jobs API answers, not a 500. A bad rate still fails loudly (not a cache error).
        try:
            return super().allow_request(request, view)
        except CACHE_ERRORS as exc:
            logger.warning("jobs throttle: the cache is unavailable (%s); request let through", exc)
            return True
