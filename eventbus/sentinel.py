"""Kept for imports of `eventbus.sentinel` (the settings helpers of docs/howto/sentinel.md): the
code lives in eventbus.redis.sentinel. `celery_broker` and `django_redis_cache` are also
importable from `eventbus` itself."""

from eventbus.redis.sentinel import celery_broker, django_redis_cache, parse_sentinel_url

__all__ = ["celery_broker", "django_redis_cache", "parse_sentinel_url"]
