"""The jobs API's throttle: DRF's ScopedRateThrottle for the scope "jobs".

The rate is REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["jobs"] ("120/min": per user, or per
address for a request not authenticated), or DEFAULT_RATE when the project sets none: DRF's own
class would fail every request of a project without that key (ImproperlyConfigured, a 500).
None turns it off. A throttled request gets a 429 problem with Retry-After.

Throttles count in the default cache, as DRF's do: a django-redis cache there should serialize
with JSON, not its default pickle (see the README, "Production settings").
"""

from __future__ import annotations

from rest_framework.settings import api_settings
from rest_framework.throttling import ScopedRateThrottle

SCOPE = "jobs"
DEFAULT_RATE = "120/min"


class JobsThrottle(ScopedRateThrottle):
    def get_rate(self):
        # Read per request, not DRF's class attribute frozen at import: settings overrides apply.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope, DEFAULT_RATE)
