"""Throttles on the answers the Idempotency-Key middleware gives itself: a replay, a 409 (in
progress), a 422 (the key reused with another request), a 400 (a key missing or malformed).
The view does not run for them, so its throttles would never count them: a client could replay
one answer, or send mismatched keys, as fast as it liked.

- A DRF view: its own throttles (`get_throttles()`, per view and per action) count the request
  before the middleware answers, as the view's dispatch would; a throttled client gets the
  view's 429 (its exception handler's body, with Retry-After). A request the view runs is
  counted by the view itself, once.
- Any other view: IDEMPOTENCY["THROTTLE_RATE"] ("120/min", say; None, the default: none), per
  principal (the key's scope), counted in IDEMPOTENCY["CACHE_ALIAS"]; past it, a 429 problem
  with Retry-After (urn:problem:idempotency-throttled).

Authentication still comes first: these run only for a request whose scope was resolved.
Counts live in the cache as JSON (JSONHistory), never unpickled. While the cache is unreachable
requests go through uncounted (logged), as the idempotency layer falls back to the database.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math

from django.core.cache import caches
from django_redis.cache import RedisCache as DjangoRedisCache
from django_redis.exceptions import ConnectionInterrupted
from redis.exceptions import RedisError
from rest_framework.throttling import SimpleRateThrottle

from .conf import idempotency_settings
from .exceptions import IdempotencyThrottled
from .problems import problem_from_error
from .scope import drf_view_class

# The cache unreachable (a Redis restart, a failover): requests go through uncounted meanwhile.
CACHE_ERRORS = (ConnectionInterrupted, RedisError, OSError)

logger = logging.getLogger(__name__)


class JSONHistory:
    """A throttle's history (the times of a client's recent requests, newest first) in a cache
    as JSON text: the `get` and `set` DRF's SimpleRateThrottle calls on its `cache`. On
    django-redis through its raw Redis client (plain GET and SET, never the cache's serializer,
    which unpickles by default: a forged pickle there would run code); on another backend
    through the cache's API."""

    def __init__(self, alias: str = "default"):
        self.cache = caches[alias]
        self.raw = None
        if isinstance(self.cache, DjangoRedisCache):
            from django_redis import get_redis_connection

            self.raw = get_redis_connection(alias, write=True)

    def get(self, key: str, default=None):
        """The history under `key`, or `default`: also when the entry does not decode (corrupt,
        or written by someone else), logged, so that the request's own count replaces it."""
        if self.raw is not None:
            text = self.raw.get(self.cache.make_key(key))
        else:
            try:
                text = self.cache.get(key)
            except CACHE_ERRORS:
                raise  # unreachable: the throttle's caller lets the request through
            except Exception as exc:  # the backend's own decoding (a pickle) failed
                return self._undecodable(key, f"{type(exc).__name__}: {exc}", default)
        if text is None:
            return default
        try:
            history = json.loads(text)
        except (TypeError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            return self._undecodable(key, f"not JSON: {exc}", default)
        if not isinstance(history, list) or not all(
            isinstance(at, (int, float)) and not isinstance(at, bool) and math.isfinite(at) for at in history
        ):
            return self._undecodable(key, "not a list of request times", default)
        return history

    def set(self, key: str, history: list, timeout) -> None:
        text = json.dumps(history)
        if self.raw is not None:
            self.raw.set(self.cache.make_key(key), text, ex=max(1, math.ceil(timeout)))
        else:
            self.cache.set(key, text, timeout)

    @staticmethod
    def _undecodable(key: str, why: str, default):
        logger.warning("throttle: the entry %s does not decode (%s); counted afresh", key, why)
        return default


class ScopeThrottle(SimpleRateThrottle):
    """IDEMPOTENCY["THROTTLE_RATE"] per key scope (tenant and principal)."""

    cache_format = "throttle_idempotency_%(ident)s"

    def __init__(self, rate: str, scope: str):
        self.rate = rate
        self.num_requests, self.duration = self.parse_rate(rate)
        self.scope_ident = hashlib.sha256(scope.encode()).hexdigest()  # any characters, one length
        # Duck-typed: DRF's throttle calls only the cache's get and set.
        self.cache = JSONHistory(idempotency_settings.CACHE_ALIAS)  # type: ignore[assignment]

    def get_cache_key(self, request, view):
        return self.cache_format % {"ident": self.scope_ident}


def throttled_answer(request, view_func, view_args, view_kwargs, scope: str):
    """The 429 that replaces the middleware's own answer to a throttled client, or None."""
    if drf_view_class(view_func) is not None:
        return _drf_throttled(request, view_func, view_args, view_kwargs)
    rate = idempotency_settings.THROTTLE_RATE
    if rate is None:
        return None
    throttle = ScopeThrottle(rate, scope)
    try:
        # No DRF view here: ScopeThrottle reads none.
        if throttle.allow_request(request, None):  # type: ignore[arg-type]
            return None
    except CACHE_ERRORS as exc:
        logger.warning("idempotency throttle: the cache is unavailable (%s); request let through", exc)
        return None
    return problem_from_error(IdempotencyThrottled(retry_after=max(1, math.ceil(throttle.wait() or 1))))


def _drf_throttled(request, view_func, view_args, view_kwargs):
    """The DRF view's own throttles, as its dispatch runs them (the authentication the middleware
    did is handed over: idempotency.adapters.drf); their 429 as the view would answer it."""
    from rest_framework.exceptions import Throttled

    view = view_func.cls(**getattr(view_func, "initkwargs", {}))
    view.args, view.kwargs = view_args, view_kwargs
    if getattr(view_func, "actions", None) is not None:
        view.action_map = view_func.actions
    view.headers = view.default_response_headers
    drf_request = view.initialize_request(request)
    view.request = drf_request
    try:
        view.check_throttles(drf_request)
        return None
    except Throttled as exc:
        view.format_kwarg = view.get_format_suffix(**view_kwargs)
        drf_request.accepted_renderer, drf_request.accepted_media_type = view.perform_content_negotiation(
            drf_request, force=True
        )
        response = view.finalize_response(drf_request, view.handle_exception(exc))
        return response.render()
