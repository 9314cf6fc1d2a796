"""Redis Sentinel: one URL for a Sentinel-managed master, in every connection.

    redis+sentinel://[:password@]host1:26379[,host2:26379...]/<master name>[/<db>]

names the master that the sentinels at host1, host2... watch (the password is the master's;
the sentinels are asked without one). Set it as EVENTBUS["REDIS_URL"] (or REDIS_URL) and the
bus's clients, the worker's, the router's, the reclaimer's and the gateway hub's, follow the
master through failovers (redis-py's Sentinel). Celery and django-redis take the same master in
their own forms: `celery_broker(url)` and `django_redis_cache(url)` give them; no import of
Django, Redis or the bus here, so a settings module can use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from eventbus.redis.redaction import masked_url

SCHEME = "redis+sentinel://"
SENTINEL_PORT = 26379


class BadSentinelURL(ValueError):
    pass


@dataclass(frozen=True)
class SentinelURL:
    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    password: str | None = None

    def master_for(self, sentinel_class, redis_class, **kwargs):
        """A client of the current master, built with redis-py's (or redis.asyncio's) Sentinel."""
        sentinel = sentinel_class(list(self.sentinels), socket_timeout=kwargs.get("socket_timeout", 1.0))
        return sentinel.master_for(
            self.master, redis_class=redis_class, db=self.db, password=self.password, **kwargs
        )


def parse_sentinel_url(url: str) -> SentinelURL | None:
    """The parts of a redis+sentinel:// URL; None for any other URL (a plain Redis's)."""
    if not url.startswith(SCHEME):
        return None
    rest = url[len(SCHEME) :]
    netloc, _, path = rest.partition("/")
    password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        password = unquote(userinfo.partition(":")[2] or userinfo) or None
    sentinels = []
    for address in filter(None, netloc.split(",")):
        host, _, port = address.rpartition(":") if ":" in address else (address, "", "")
        try:
            sentinels.append((host or address, int(port) if port else SENTINEL_PORT))
        except ValueError:
            raise BadSentinelURL(f"{masked_url(url)!r}: {address!r} is not host:port") from None
    parts = [p for p in path.split("/") if p]
    if not sentinels or not parts or len(parts) > 2:
        raise BadSentinelURL(
            f"{masked_url(url)!r} is not {SCHEME}[:password@]host:port[,host:port...]/<master name>[/<db>]"
        )
    if len(parts) == 2 and not parts[1].isdigit():
        raise BadSentinelURL(f"{masked_url(url)!r}: the database {parts[1]!r} is not a number")
    return SentinelURL(tuple(sentinels), unquote(parts[0]), int(parts[1]) if len(parts) == 2 else 0, password)


def _parsed(url: str) -> SentinelURL:
    parsed = parse_sentinel_url(url)
    if parsed is None:
        raise BadSentinelURL(f"{masked_url(url)!r} is not a {SCHEME} URL")
    return parsed


def celery_broker(url: str) -> tuple[str, dict]:
    """Celery's Redis transport through the sentinels.

    Parameters
    ----------
    url : str
        A redis+sentinel:// URL.

    Returns
    -------
    tuple of (str, dict)
        (broker_url, transport options to add).
    """
    parsed = _parsed(url)
    auth = f":{parsed.password}@" if parsed.password else ""
    broker = ";".join(f"sentinel://{auth}{host}:{port}/{parsed.db}" for host, port in parsed.sentinels)
    return broker, {"master_name": parsed.master}


def django_redis_cache(url: str, *, key_prefix: str = "") -> dict:
    """A CACHES entry for django-redis on the master the sentinels name.

    Parameters
    ----------
    url : str
        A redis+sentinel:// URL.
    key_prefix : str
        The cache's KEY_PREFIX.

    Returns
    -------
    dict
    """
    parsed = _parsed(url)
    auth = f":{parsed.password}@" if parsed.password else ""
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{auth}{parsed.master}/{parsed.db}",
        "KEY_PREFIX": key_prefix,
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "SENTINELS": list(parsed.sentinels),
            # JSON, not django-redis's default pickle: whoever can write to Redis must not run
            # code in the processes that read the cache.
            "SERIALIZER": "django_redis.serializers.json.JSONSerializer",
        },
    }
