"""The jobs API's throttle: DRF's ScopedRateThrottle for the scope "jobs".

The rate is REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["jobs"] ("120/min": per user, or per
address for a request not authenticated), or DEFAULT_RATE when the project sets none: DRF's own
class would fail every request of a project without that key (ImproperlyConfigured, a 500).
None turns it off. A throttled request gets a 429 problem with Retry-After. While the cache is
unreachable, requests go through unthrottled (logged): the API keeps answering.

Throttles count in the default cache, as DRF's do: a django-redis cache there should serialize
with JSON, not its default pickle (see docs/howto/deploy.md, "Deploy beyond one machine").
"""

from __future__ import annotations

import logging

from django_redis.exceptions import ConnectionInterrupted
from redis.exceptions import RedisError
from rest_framework.settings import api_settings
from rest_framework.throttling import ScopedRateThrottle

SCOPE = "jobs"
DEFAULT_RATE = "120/min"
# The cache unreachable (a Redis restart, a failover): requests go through unthrottled meanwhile.
CACHE_ERRORS = (ConnectionInterrupted, RedisError, OSError)

logger = logging.getLogger(__name__)


class JobsThrottle(ScopedRateThrottle):
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
