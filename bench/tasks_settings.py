"""Settings of the tasks benchmark's Django processes (bench/tasks.py starts them), one module for
the three systems; BENCH_TASKS_SYSTEM says which one a process belongs to.

Common: the project's base settings (its middleware, its Celery settings: acks late, prefetch 1)
with DEBUG off, quiet logging, persistent database connections (gunicorn's gthread workers and
the task workers), and bench/tasks_app.py's two URLs as the whole URLconf.

- `ours`: TASKS' default backend eventbus.backends.ExactlyOnceBackend (the project's, as it ships).
- `dbtasks`: django-tasks-db's DatabaseBackend (its app installed: its table, its db_worker).
- `celery`: no task backend used; Celery's Redis result backend (the system's own Redis), and
  Celery imports the bench's task.

Environment (set by bench/tasks.py): DATABASE_URL, REDIS_URL (the system's own), BENCH_TASKS_SYSTEM,
BENCH_JOBS_EXEC_LOG (the execution log), BENCH_TASKS_AFTER_MS (the `after` kind's delay),
BENCH_CELERY_DB_REUSE_MAX (unset: the project's Celery settings, CELERY_DB_REUSE_MAX 1000).
"""

import os

from config.settings.base import *  # noqa: F401,F403
from config.settings.base import DATABASES, INSTALLED_APPS, REDIS_URL

SYSTEM = os.environ.get("BENCH_TASKS_SYSTEM", "ours")

DEBUG = False
SECRET_KEY = "bench-tasks-only-key-not-a-secret"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "bench.tasks_app"
DATABASES["default"]["CONN_MAX_AGE"] = 300
# The URLconf is the bench's two views: the idempotency app's problem pages are not among them.
SILENCED_SYSTEM_CHECKS = ["idempotency.W001"]

if os.environ.get("BENCH_CELERY_DB_REUSE_MAX"):
    # bench/tasks.py --db-reuse-max: Celery's Django fixup closes a worker's database connections
    # before and after each task unless this is set (then every 2 x N tasks); the project's
    # settings set 1000, and 0 measures what closing them costs.
    CELERY_DB_REUSE_MAX = int(os.environ["BENCH_CELERY_DB_REUSE_MAX"])

if SYSTEM == "ours":
    TASKS = {"default": {"BACKEND": "eventbus.backends.ExactlyOnceBackend"}}
elif SYSTEM == "dbtasks":
    INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
else:
    TASKS = {"default": {"BACKEND": "django_tasks.backends.dummy.DummyBackend"}}
    CELERY_RESULT_BACKEND = REDIS_URL
    CELERY_IMPORTS = ["bench.tasks_app"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
