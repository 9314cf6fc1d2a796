"""An exception reporter filter that hides the password of every URL in what an error report
shows: the settings (REDIS_URL, CACHE_URL, CELERY_BROKER_URL, CACHES' LOCATION, the broker's
transport options, nested at any depth), the request's META (under WSGI, the process's
environment too) and the traceback's string variables.

Django's own filter hides settings by their name (KEY, SECRET, PASS, TOKEN...), not a
`redis://:PASSWORD@host` held under a name like REDIS_URL or LOCATION, which the DEBUG page and
the error e-mails to ADMINS then show to whoever sees them. In the project's settings:

    DEFAULT_EXCEPTION_REPORTER_FILTER = "eventbus.reporting.SafeExceptionReporterFilter"

It lives in the event bus, next to the one URL masker (eventbus.redis.redaction.masked_url): the
URLs it hides are the bus's Redis, its broker's and its cache's. The check eventbus.W001 warns
when a setting holds a URL whose password the filter in use would show.
"""

from __future__ import annotations

import re

from django.views import debug

from eventbus.redis.redaction import masked_url

# A string that is one URL (or kombu's list of them, joined by ";"), or carries a ?password=.
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S*")
_QUERY_PASSWORD = re.compile(r"[?&](?:password|passwd|pwd)=", re.IGNORECASE)


def masked_secrets(text: str) -> str:
    """`text` with its URL's password masked (eventbus.redis.redaction.masked_url), when it is a URL;
    any other text as it is."""
    if _URL.fullmatch(text) or _QUERY_PASSWORD.search(text):
        return masked_url(text)
    return text


class SafeExceptionReporterFilter(debug.SafeExceptionReporterFilter):
    """Django's filter, with the password of every URL-like string masked as well."""

    def cleanse_setting(self, key, value):
        # Django's recursion into dicts, lists and tuples calls this again for each item.
        cleansed = super().cleanse_setting(key, value)
        return masked_secrets(cleansed) if isinstance(cleansed, str) else cleansed

    def get_traceback_frame_variables(self, request, tb_frame):
        return [
            (name, masked_secrets(value) if isinstance(value, str) else value)
            for name, value in super().get_traceback_frame_variables(request, tb_frame)
        ]


def settings_showing_passwords() -> list[str]:
    """The settings whose URL password the project's exception reporter filter would show."""
    shown = debug.get_exception_reporter_filter(None).get_safe_settings()
    return sorted(name for name, value in shown.items() if _shows_password(value))


def _shows_password(value) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if masked_secrets(item) != item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False
