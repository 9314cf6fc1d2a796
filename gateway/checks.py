"""System checks of the gateway: the cache the jobs API's throttle counts in."""

from django.conf import settings
from django.core.checks import Tags, Warning, register
from django.utils.module_loading import import_string


@register(Tags.caches)
def check_throttle_cache(app_configs=None, **kwargs):
    """The jobs throttle reads its counts from the default cache. On django-redis it reads them
    as raw JSON (gateway.throttling.JSONHistory); the other shared backends unpickle what they
    read, so whoever can write to that store could run code in every web process."""
    from .throttling import CACHE_ALIAS, PRIVATE_BACKENDS  # DRF's throttling reads its settings on import

    backend = settings.CACHES.get(CACHE_ALIAS, {}).get("BACKEND", "")
    if backend in PRIVATE_BACKENDS:
        return []
    try:
        from django_redis.cache import RedisCache

        if issubclass(import_string(backend), RedisCache):
            return []
    except ImportError:
        pass
    return [
        Warning(
            f"The jobs API's throttle counts in the {CACHE_ALIAS!r} cache, whose backend {backend} "
            "unpickles what it reads: an entry forged in that store would run code in the web process.",
            hint="Use django_redis.cache.RedisCache (the throttle reads it as raw JSON) for the default "
            "cache, or a cache only this process writes (LocMemCache).",
            id="gateway.W001",
        )
    ]
