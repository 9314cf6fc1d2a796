"""Settings shared by every environment; dev.py, test.py and production.py refine them.

Environment: REDIS_URL (default redis://127.0.0.1:6379/0), DATABASE_URL (default SQLite);
CELERY_BROKER_URL and CACHE_URL (default REDIS_URL: set them when the event bus is on a Redis
Cluster, which neither Celery's broker nor the cache can use); EVENTBUS_CLUSTER=1 puts the event
bus on the cluster REDIS_URL names (EVENTBUS["CLUSTER"]). Each of these Redis URLs may be a
redis+sentinel://host:port,host:port/<master>/<db> URL: a Sentinel-managed master, followed
through failovers (eventbus.redis.sentinel). RUN_DIR (default .run/) is where
`make run` and the tests keep their local state. METRICS_TOKEN: the bearer token /metrics asks
for (config.views); unset, it answers clients on this machine only.
"""

import os
from pathlib import Path

import dj_database_url

from eventbus.redis.sentinel import celery_broker, django_redis_cache, parse_sentinel_url


def env_flag(name: str, default: bool = False) -> bool:
    """A yes/no environment variable: 1, true, yes or on (any case) is yes; unset, the default."""
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


BASE_DIR = Path(__file__).resolve().parent.parent.parent
# Git-ignored: private Redis data, demo credentials, metrics files, test DB. RUN_DIR moves it
# (the stack's test runs a whole stack in a directory of its own).
RUN_DIR = Path(os.environ.get("RUN_DIR") or BASE_DIR / ".run")

DEBUG = False
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "").split(",") if h]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",  # the jobs API's OpenAPI schema at /api/schema/ (config/urls.py)
    "channels",
    "idempotency",
    "eventbus",
    "gateway",
    "config",  # the demo project itself: its ensure_demo_user command
]

# Django's task API (django.tasks; django-tasks' backport on Django 5.2) on the toolkit's jobs:
# each task runs exactly once to completion, delayed, prioritised, keyed (eventbus.backends).
TASKS = {
    "default": {
        "BACKEND": "eventbus.backends.ExactlyOnceBackend",
        "QUEUES": ["default", "reports"],
    }
}

MIDDLEWARE = [
    # First: its latency covers the other middlewares and the view (config.http_metrics).
    "config.http_metrics.HttpMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: it calls the view itself, after authentication and CSRF (see idempotency.checks).
    "idempotency.middleware.IdempotencyMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def database_from_env(default_sqlite_path):
    config = dj_database_url.config(default=f"sqlite:///{default_sqlite_path}")
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # Concurrent writers wait for the lock instead of failing at once; IMMEDIATE
        # takes the write lock at BEGIN so two transactions never deadlock on upgrade.
        config.setdefault("OPTIONS", {}).update(
            {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
        )
    return config


DATABASES = {"default": database_from_env(BASE_DIR / "db.sqlite3")}
METRICS_TOKEN = os.environ.get("METRICS_TOKEN") or None
# One user's job stream sockets per web process (gateway.socketcap); 0: no cap (the gateway
# benchmark holds thousands of one user's sockets).
GATEWAY = {"MAX_SOCKETS_PER_USER": int(os.environ.get("MAX_SOCKETS_PER_USER", "100"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CACHE_URL = os.environ.get("CACHE_URL") or REDIS_URL
# The Redis URLs carry the server's password: error reports (the DEBUG page, the e-mails to
# ADMINS) show them with it masked, nested settings and the request's environment included.
DEFAULT_EXCEPTION_REPORTER_FILTER = "eventbus.reporting.SafeExceptionReporterFilter"


def redis_cache(location: str, key_prefix: str) -> dict:
    """A django-redis cache (the test suite and the benchmarks build theirs the same way), on a
    Sentinel-managed master for a redis+sentinel:// URL (eventbus.redis.sentinel)."""
    if parse_sentinel_url(location):
        return django_redis_cache(location, key_prefix=key_prefix)
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": location,
        "KEY_PREFIX": key_prefix,
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.DefaultClient",
            # JSON, not django-redis's default pickle: a forged entry (whoever can write to this
            # Redis) would be unpickled, running code, by whatever reads it: DRF's throttles too.
            "SERIALIZER": "django_redis.serializers.json.JSONSerializer",
        },
    }


CACHES = {"default": redis_cache(CACHE_URL, "cache")}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
SERVE_STATIC = False  # dev and test settings let daphne serve /static/ (see config/asgi.py)
STATIC_ROOT = BASE_DIR / "staticfiles"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"

REST_FRAMEWORK = {
    # Token first: DRF answers an unauthenticated request with the first class's
    # WWW-Authenticate challenge, so it gets 401 rather than 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "idempotency.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "EXCEPTION_HANDLER": "idempotency.problems.drf_exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # The jobs API's throttle (gateway.throttling), per user; None: not throttled.
    "DEFAULT_THROTTLE_RATES": {"jobs": "120/min"},
    # drf-spectacular describes the views (gateway.openapi): /api/schema/.
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Exactly-once jobs API",
    "DESCRIPTION": "Start jobs once per Idempotency-Key, list them, see their stages (docs/reference/http-api.md: The jobs API).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,  # the schema's own endpoint is not part of the API it describes
    # One name per set of choices: a job's states and a stage's.
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "eventbus.models.Job.State",
        "StageStateEnum": "gateway.serializers.STAGE_STATES",
    },
}

IDEMPOTENCY: dict[str, object] = {
    "STORE": "idempotency.stores.cached.CachedStore",
    "CACHE_ALIAS": "default",
}

# The event bus: see eventbus.conf for every key. test.py adds its own keys to this dict.
# The demo's job types, written with the toolkit's public API (config/jobs.py).
DEMO_JOB_TYPES = ("config.jobs.ScanJob", "config.jobs.ChatJob", "config.jobs.ApprovalJob")
EVENTBUS: dict[str, object] = {"JOB_TYPES": DEMO_JOB_TYPES}
if env_flag("EVENTBUS_CLUSTER"):
    EVENTBUS["CLUSTER"] = True

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or REDIS_URL
_broker_sentinel_options: dict = {}
if parse_sentinel_url(CELERY_BROKER_URL):  # kombu's form: sentinel://host:port;... + master_name
    CELERY_BROKER_URL, _broker_sentinel_options = celery_broker(CELERY_BROKER_URL)
    # Celery prefers the environment's CELERY_BROKER_URL (here the redis+sentinel:// form) to
    # this setting, but takes its read and write URLs, which its connections use, from settings.
    CELERY_BROKER_READ_URL = CELERY_BROKER_WRITE_URL = CELERY_BROKER_URL
# JSON only, said outright (Celery's default too): a message read from the broker is never unpickled.
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes the database connections before and after every task unless
# this is set, whatever CONN_MAX_AGE says: every job's run would connect anew. With it, the
# connections live as CONN_MAX_AGE and CONN_HEALTH_CHECKS say (eventbus.tasks.run_job closes
# the broken or obsolete ones around each run, as Django does around a request).
CELERY_DB_REUSE_MAX = 1000
# Redis broker. A task delivered to a worker that died without acking it goes back to its queue
# after visibility_timeout seconds: longer than any job and its retry countdowns (or a running
# job is delivered twice: harmless, see eventbus.job.runs, but wasted), and at most EVENTBUS
# DEDUP_TTL. The restore sweep then runs every tenth of it (10 s at most).
_visibility_timeout = int(os.environ.get("CELERY_VISIBILITY_TIMEOUT", 3600))
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": _visibility_timeout,
    "unacked_restore_interval": max(1, min(10, _visibility_timeout // 10)),
    "unacked_restore_throttle": 1,
    # Sending a task to an unreachable broker fails in well under a second (connection refused)
    # or 2 x 1 s (no answer) instead of retrying: eventbus.tasks.enqueue then leaves the
    # job to the sweep, and the request that accepted it is not held up.
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
    "socket_connect_timeout": 1,
    **_broker_sentinel_options,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    # Replaces Django's default "django" logger, whose own console handler would print twice.
    "loggers": {"django": {"handlers": ["console"], "level": "INFO", "propagate": False}},
}
