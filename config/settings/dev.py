"""Local development: DEBUG on, a fixed insecure key, any local host."""

from .base import *  # noqa: F401,F403
from .base import EVENTBUS

DEBUG = True
SECRET_KEY = "django-insecure-development-only-never-use-in-production"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
SERVE_STATIC = True  # config.asgi serves /static/ itself
# Stages long enough to watch a job move on the page: a scan's four stages, and a chat answer's
# 7-10 chunks, take 6 s in all (config/jobs.py). A job whose run was lost (Ctrl-C mid-job, then
# `make run` again) is picked up again within half a minute (eventbus.job.recovery).
EVENTBUS = {**EVENTBUS, "STAGE_SECONDS": 1.5, "RECOVER_AFTER": 20}
