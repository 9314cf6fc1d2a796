"""Settings of the jobs benchmark's Django processes (bench/jobs.py starts them), one module for
the three systems; BENCH_JOBS_SYSTEM says which one a process belongs to.

Common: the project's base settings with DEBUG off, quiet logging, no throttle on the jobs API
and no cap on a user's running jobs (the bench's one user runs --concurrency jobs at once, and
the figures are the stack's, not its limits').

- `ours`: the project as it ships (config.urls, config.asgi with the gateway, the idempotency
  middleware), the bench's job type (bench.jobs_stages.BenchJob) as the only one.
- `channels` (baseline a) and `dbos` (baseline b): the same project minus what would be ours on
  their request path: no idempotency middleware, DRF's own TokenAuthentication, and the
  baselines' URLs and ASGI app (bench/jobs_baselines.py, bench/jobs_asgi.py). `channels` adds
  Channels' Redis channel layer and has Celery import the baseline's task; `dbos` has no channel
  layer (its consumer reads DBOS's stream: it uses no Redis at all).

Environment (set by bench/jobs.py): DATABASE_URL, REDIS_URL (the system's own), BENCH_JOBS_SYSTEM,
BENCH_CONN_MAX_AGE (the Celery workers' persistent connections; 0 in the ASGI servers, which run
each sync request in a thread of its own), BENCH_DB_POOL (the ASGI servers: Django's psycopg pool,
at most this many connections).
"""

import os

from config.settings.base import *  # noqa: F401,F403
from config.settings.base import DATABASES, EVENTBUS, INSTALLED_APPS, MIDDLEWARE, REDIS_URL, REST_FRAMEWORK

SYSTEM = os.environ.get("BENCH_JOBS_SYSTEM", "ours")

DEBUG = False
SECRET_KEY = "bench-jobs-only-key-not-a-secret"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ.get("BENCH_CONN_MAX_AGE") or 0)
if os.environ.get("BENCH_DB_POOL"):
    # The ASGI servers: Django's psycopg pool (a request's thread takes a connection from it and
    # gives it back), what Django's docs advise under ASGI instead of persistent connections.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 2,
        "max_size": int(os.environ["BENCH_DB_POOL"]),
        "timeout": 30,
    }

# Every process's database writes counted (bench/jobs_stages.py), in all three systems alike.
INSTALLED_APPS = [*INSTALLED_APPS, "bench.jobs_stages.WriteCounting"]

REST_FRAMEWORK = {**REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"jobs": None}}
EVENTBUS = {
    **EVENTBUS,
    "JOB_TYPES": ("bench.jobs_stages.BenchJob",),
    "MAX_RUNNING_JOBS_PER_USER": None,
    "MAX_JOBS_CREATED_PER_USER": None,
}

if SYSTEM != "ours":
    ROOT_URLCONF = "bench.jobs_baselines"
    ASGI_APPLICATION = "bench.jobs_asgi.application"
    MIDDLEWARE = [m for m in MIDDLEWARE if m != "idempotency.middleware.IdempotencyMiddleware"]
    REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"] = [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ]

if SYSTEM == "channels":
    # Celery loads the baseline's task (config.celery autodiscovers the installed apps' only).
    CELERY_IMPORTS = ["bench.jobs_baselines"]
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
