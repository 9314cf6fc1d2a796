"""The one rule of the demo's entry points (manage.py, config.asgi, the Celery worker of
config.celery): none chooses the settings itself. Without DJANGO_SETTINGS_MODULE each refuses to
start, naming the variable: a default would run either a deployment on the development settings
(DEBUG on, a public SECRET_KEY) or a developer's command on the production ones. `make run`
(config.stack), `make test` (pytest's settings) and the benchmarks set theirs."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

VARIABLE = "DJANGO_SETTINGS_MODULE"


def require_settings_module(entry_point: str) -> None:
    if not os.environ.get(VARIABLE):
        raise ImproperlyConfigured(
            f"{entry_point} needs {VARIABLE} in the environment: config.settings.production for a "
            "deployment (with DJANGO_SECRET_KEY, ALLOWED_HOSTS and REDIS_URL), config.settings.dev "
            "to develop (`make run` sets it). No entry point of the demo chooses for you."
        )
