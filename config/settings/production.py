"""Production: every secret and host comes from the environment, and HTTPS is the only way in.

- DJANGO_SECRET_KEY, ALLOWED_HOSTS (comma-separated), REDIS_URL: required (without REDIS_URL the
  event bus, the cache and the broker would fall back to an unauthenticated 127.0.0.1:6379).
- SECURE_SSL_REDIRECT, default 1: plain-HTTP requests are redirected to HTTPS (0 when the proxy in
  front redirects them itself).
- SECURE_HSTS_SECONDS, default 31536000 (a year): a browser that saw the site once uses only HTTPS
  for it this long; 0 turns HSTS off.
- SECURE_HSTS_INCLUDE_SUBDOMAINS, default 0: 1 extends HSTS to every subdomain, which must then all
  serve HTTPS.
- SECURE_HSTS_PRELOAD, default 0: 1 allows submitting the domain to the browsers' preload lists
  (with include-subdomains; hard to undo).
- BEHIND_TLS_PROXY, default 0: 1 when a proxy that terminates TLS is the only way in and sets
  X-Forwarded-Proto; Django then believes that header. Without such a proxy any client could send
  it and pass for HTTPS.
"""

import os

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F401,F403
from .base import env_flag

DEBUG = False
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "config.settings.production needs DJANGO_SECRET_KEY (and ALLOWED_HOSTS) in the environment. "
        "For development, set DJANGO_SETTINGS_MODULE=config.settings.dev or use `make run`."
    )
if not os.environ.get("REDIS_URL"):
    raise ImproperlyConfigured(
        "config.settings.production needs REDIS_URL in the environment (redis://:PASSWORD@host:6379/0, "
        "or a redis+sentinel:// URL): it does not fall back to an unauthenticated 127.0.0.1:6379."
    )
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True

SECURE_SSL_REDIRECT = env_flag("SECURE_SSL_REDIRECT", True)
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", 365 * 24 * 3600))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_flag("SECURE_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = env_flag("SECURE_HSTS_PRELOAD")
if env_flag("BEHIND_TLS_PROXY"):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Left off unless asked, as above: the project cannot know whether every subdomain serves HTTPS,
# or whether the domain should go on the preload lists. `check --deploy` warns about both; the
# choice is deliberate, so those two warnings are silenced while they stay off.
SILENCED_SYSTEM_CHECKS = [
    *(["security.W005"] if not SECURE_HSTS_INCLUDE_SUBDOMAINS else []),
    *(["security.W021"] if not SECURE_HSTS_PRELOAD else []),
]
