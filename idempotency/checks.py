"""System checks: the middleware must run after the middleware it depends on, the
IDEMPOTENCY settings must be valid, and a SQLite database should take its write lock at BEGIN."""

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .conf import idempotency_settings
from .policy import MODES
from .problems import documentation_url

MIDDLEWARE_PATH = "idempotency.middleware.IdempotencyMiddleware"
MUST_COME_BEFORE = (
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
)


@register()
def check_middleware_order(app_configs=None, **kwargs):
    middleware = list(settings.MIDDLEWARE)
    if MIDDLEWARE_PATH not in middleware:
        return []
    position = middleware.index(MIDDLEWARE_PATH)
    errors = []
    for path in MUST_COME_BEFORE:
        if path in middleware and middleware.index(path) > position:
            errors.append(
                Error(
                    f"{MIDDLEWARE_PATH} must come after {path} in MIDDLEWARE.",
                    hint="Put the idempotency middleware last: it calls the view itself, after authentication "
                    "and CSRF checks; middleware after it would be skipped for keyed requests.",
                    id="idempotency.E001",
                )
            )
    if position != len(middleware) - 1:
        errors.append(
            Error(
                f"{MIDDLEWARE_PATH} must be the last entry of MIDDLEWARE.",
                hint="It calls the view itself for keyed requests, so the process_view of middleware after "
                "it would not run.",
                id="idempotency.E002",
            )
        )
    return errors


@register()
def check_settings(app_configs=None, **kwargs):
    try:
        policy = idempotency_settings.DEFAULT_POLICY
        methods = idempotency_settings.METHODS
        numbers = {name: getattr(idempotency_settings, name) for name in ("TTL", "LEASE_SECONDS")}
        # Imported now, so that a bad dotted path is this check's error.
        _ = idempotency_settings.STORE, idempotency_settings.SCOPE_RESOLVER
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="idempotency.E003")]
    errors = []
    if policy not in MODES:
        errors.append(Error(f"IDEMPOTENCY['DEFAULT_POLICY'] must be one of {MODES}.", id="idempotency.E004"))
    if idempotency_settings.DEFAULT_POLICY_VIEWS not in ("api", "all"):
        errors.append(
            Error("IDEMPOTENCY['DEFAULT_POLICY_VIEWS'] must be 'api' or 'all'.", id="idempotency.E004")
        )
    if any(m != m.upper() or m in ("GET", "HEAD", "OPTIONS") for m in methods):
        errors.append(
            Error("IDEMPOTENCY['METHODS'] lists upper-case unsafe methods only.", id="idempotency.E005")
        )
    for name, value in numbers.items():
        if not isinstance(value, int) or value <= 0:
            errors.append(
                Error(f"IDEMPOTENCY[{name!r}] must be a positive number of seconds.", id="idempotency.E006")
            )
    errors.extend(_check_cache_alias())
    return errors


def _check_cache_alias():
    from .stores.cached import SUPPORTED_BACKEND, CachedStore, unsupported_backend

    store, alias = idempotency_settings.STORE, idempotency_settings.CACHE_ALIAS
    if not (isinstance(store, type) and issubclass(store, CachedStore)):
        return []
    if alias not in settings.CACHES:
        return [
            Error(
                f"IDEMPOTENCY['CACHE_ALIAS'] is {alias!r}, which is not in CACHES ({sorted(settings.CACHES)}).",
                hint="Name a configured cache, or use idempotency.stores.db.DatabaseStore.",
                id="idempotency.E007",
            )
        ]
    backend = settings.CACHES[alias].get("BACKEND", "")
    try:
        supported = issubclass(import_string(backend), import_string(SUPPORTED_BACKEND))
    except ImportError:
        supported = False
    if not supported:
        return [
            Error(
                unsupported_backend(alias, backend),
                hint=f"Point CACHE_ALIAS at a {SUPPORTED_BACKEND} cache, or use idempotency.stores.db.DatabaseStore.",
                id="idempotency.E008",
            )
        ]
    return []


@register(Tags.urls)
def check_problem_documentation(app_configs=None, **kwargs):
    if documentation_url("urn:problem:idempotency-key-missing") is None:
        return [
            Warning(
                "The idempotency problem types have no documentation URL: problem responses go out without "
                'a Link: rel="describedby" header.',
                hint='Add path("idempotency/", include("idempotency.urls")) to the project\'s URLs.',
                id="idempotency.W001",
            )
        ]
    return []


@register()
def check_sqlite_transaction_mode(app_configs=None, **kwargs):
    """A SQLite database whose transactions are DEFERRED: one that reads and then writes fails at
    once with "database is locked" while another connection writes (SQLite's busy timeout does
    not wait there). The toolkit's own transactions take the lock first
    (idempotency.transactions); the project's views, admin and stages do not."""
    from django.db import connections

    return deferred_sqlite_warnings(connections)


def deferred_sqlite_warnings(handler) -> list[Warning]:
    """idempotency.W002 for each database of `handler` (django.db.connections) that defers
    SQLite's write lock."""
    from .transactions import defers_write_lock

    return [
        Warning(
            f"DATABASES[{alias!r}] is SQLite with DEFERRED transactions: a transaction that reads and "
            'then writes fails with "database is locked" as soon as another request or the worker '
            "writes at the same time.",
            hint=f'Add "transaction_mode": "IMMEDIATE" to DATABASES[{alias!r}][\'OPTIONS\']: every '
            "transaction then takes the write lock at BEGIN, waiting for it up to the OPTIONS' "
            '"timeout" (5 s unless set).',
            id="idempotency.W002",
        )
        for alias in handler
        if defers_write_lock(handler[alias])
    ]
