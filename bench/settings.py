"""Settings of the idempotency benchmark's server (bench/idempotency.py starts it).

The project's base settings (same middleware, DRF, IDEMPOTENCY with the CachedStore in front
of the database) with DEBUG off, the bench URLconf, persistent database connections, quiet
logging, and the two PyPI peers configured as their READMEs say, each on its own URL:

- drf-idempotency: its middleware (the README's quick start; bench/urls.py confines it to its
  URL, and says why not its decorator) with its quick-start storage, the DatabaseBackend (its
  own table, migrated here). It reads its options from a setting named `IDEMPOTENCY` too,
  which is ours; bench/urls.py points it at `DRF_IDEMPOTENCY` instead.
- django-idempotency-key: `ExemptIdempotencyKeyMiddleware` (opt-in per view), the
  CacheKeyStorage on a django-redis cache in our Redis, and the MultiProcessRedisLock its
  README prescribes when several processes share the storage (the server runs several
  workers), with its documented defaults (TIMEOUT 0.1 s); with one server process
  (BENCH_ONE_PROCESS set) its default ThreadLock. CONFLICT_STATUS_CODE None: a replay
  answers with the original status, as ours and drf-idempotency do (its default is 409).

Environment (set by bench/idempotency.py): DATABASE_URL (the bench's own database),
REDIS_URL (its private Redis).
"""

import os

from config.settings.base import *  # noqa: F401,F403
from config.settings.base import (
    CACHES,
    DATABASES,
    EVENTBUS,
    IDEMPOTENCY,
    INSTALLED_APPS,
    MIDDLEWARE,
    REDIS_URL,
    REST_FRAMEWORK,
    redis_cache,
)

DEBUG = False
SECRET_KEY = "bench-only-key-not-a-secret"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "bench.urls"

# Persistent connections, as a production WSGI deployment runs them: without, every request
# would also pay a new database connection, which would hide the layer's own cost. Not under
# daphne (BENCH_SERVER=daphne): Django runs each ASGI request in a new thread, so persistent
# connections would pile up until the server refuses more.
DATABASES["default"]["CONN_MAX_AGE"] = 0 if os.environ.get("BENCH_SERVER") == "daphne" else 300
# bench/idempotency.py --pool (BENCH_POOL set): Django's psycopg pool instead (it refuses
# persistent connections beside it), to measure whether it helps.
if os.environ.get("BENCH_POOL"):
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = True

# bench/idempotency.py --store database (BENCH_STORE set): our layer without its replay cache.
if os.environ.get("BENCH_STORE"):
    IDEMPOTENCY = {**IDEMPOTENCY, "STORE": os.environ["BENCH_STORE"]}

INSTALLED_APPS = [*INSTALLED_APPS, "drf_idempotency"]

# One user sends every request: the per-user cap on running jobs (no worker runs them here) is
# set out of reach, and still counted on each create as in production (the view's second read).
# So is the cap on jobs started per hour.
EVENTBUS = {**EVENTBUS, "MAX_RUNNING_JOBS_PER_USER": 10**9, "MAX_JOBS_CREATED_PER_USER": 10**9}
# Likewise the jobs API's throttle: out of reach, still asked (a cache read and write) on each.
REST_FRAMEWORK = {**REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"jobs": "1000000000/s"}}

# The peers' middleware before ours: ours must stay last (it calls the view).
MIDDLEWARE = [
    *MIDDLEWARE[:-1],
    "bench.urls.DrfIdempotencyOnItsUrl",
    "idempotency_key.middleware.ExemptIdempotencyKeyMiddleware",
    MIDDLEWARE[-1],
]

# django-idempotency-key stores pickle.dumps() bytes, which the JSON serializer of our caches
# (redis_cache) refuses: its cache keeps django-redis's own serializer. The peer's, not ours.
_peer_cache = redis_cache(REDIS_URL, "dik")
_peer_cache["OPTIONS"].pop("SERIALIZER")
CACHES = {**CACHES, "idempotency_key": _peer_cache}

IDEMPOTENCY_KEY = {
    "CONFLICT_STATUS_CODE": None,
    "STORAGE": {
        "CLASS": "idempotency_key.storage.CacheKeyStorage",
        "CACHE_NAME": "idempotency_key",
    },
    # One server process (--workers 1, daphne): its default ThreadLock is enough and right.
    "LOCK": {"CLASS": "idempotency_key.locks.basic.ThreadLock"}
    if os.environ.get("BENCH_ONE_PROCESS")
    else {
        "CLASS": "idempotency_key.locks.redis.MultiProcessRedisLock",
        "LOCATION": REDIS_URL,
    },
}

# Read by drf-idempotency once bench/urls.py renamed its setting (see the module docstring).
DRF_IDEMPOTENCY = {
    "BACKEND": "drf_idempotency.backends.database.DatabaseBackend",
    "REQUIRE_KEY": True,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
