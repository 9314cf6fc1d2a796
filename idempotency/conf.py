"""One accessor per app for its settings dict, after DRF's `api_settings`.

    from idempotency.conf import idempotency_settings
    idempotency_settings.TTL

Defaults fill what the project leaves out, dotted paths in IMPORT_STRINGS are imported,
unknown keys are refused, and `override_settings` takes effect (the cache is dropped on
`setting_changed`).
"""

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string


class AppSettings:
    def __init__(self, setting_name: str, defaults: dict, import_strings: tuple = ()):
        self.setting_name = setting_name
        self.defaults = defaults
        self.import_strings = import_strings
        self._cached: set[str] = set()
        setting_changed.connect(self._on_setting_changed, weak=False)

    @property
    def user_settings(self) -> dict:
        if not hasattr(self, "_user_settings"):
            user_settings = getattr(settings, self.setting_name, {}) or {}
            unknown = set(user_settings) - set(self.defaults)
            if unknown:
                raise ImproperlyConfigured(
                    f"{self.setting_name}: unknown key(s) {sorted(unknown)}; known: {sorted(self.defaults)}"
                )
            self._user_settings = user_settings
        return self._user_settings

    def __getattr__(self, attr: str):
        if attr.startswith("_") or attr not in self.defaults:
            raise AttributeError(f"Invalid {self.setting_name} setting: {attr!r}")
        value = self.user_settings.get(attr, self.defaults[attr])
        if attr in self.import_strings and isinstance(value, str):
            try:
                value = import_string(value)
            except ImportError as exc:
                raise ImproperlyConfigured(
                    f"{self.setting_name}[{attr!r}]: cannot import {value!r}: {exc}"
                ) from exc
        self._cached.add(attr)
        setattr(self, attr, value)
        return value

    def reload(self) -> None:
        for attr in self._cached:
            delattr(self, attr)
        self._cached.clear()
        if hasattr(self, "_user_settings"):
            delattr(self, "_user_settings")

    def _on_setting_changed(self, *, setting, **kwargs):
        if setting == self.setting_name:
            self.reload()


DEFAULTS = {
    # Methods the middleware covers; others pass through untouched.
    "METHODS": ("POST", "PATCH"),
    "HEADER": "Idempotency-Key",
    # Policy of a view that carries no @idempotency_key marker: "required", "optional" or "exempt".
    "DEFAULT_POLICY": "optional",
    # Which unmarked views DEFAULT_POLICY covers: "api" (DRF views: APIView, ViewSet, @api_view),
    # or "all". Under "api" the admin and HTML form views keep no answers unless marked (a form
    # re-posted with a key of its own should run, as it does without the middleware).
    "DEFAULT_POLICY_VIEWS": "api",
    # How long a key is remembered (seconds); an expired record counts as absent.
    "TTL": 24 * 3600,
    # How long a request owns its key without a sign of life; after that a retry may take it over.
    "LEASE_SECONDS": 60,
    # Renew a running request's lease every LEASE_SECONDS / 3, so that only a dead one loses it.
    "HEARTBEAT": True,
    "STORE": "idempotency.stores.db.DatabaseStore",
    # Cache alias for idempotency.stores.cached.CachedStore (completed replays without a query):
    # a django-redis cache (checks: idempotency.E008), whose entries are signed JSON, never pickles.
    "CACHE_ALIAS": "default",
    "SCOPE_RESOLVER": "idempotency.scope.UserScopeResolver",
    # How many of the answers the middleware gives itself (replays, 409, 422, a missing or
    # malformed key's 400) one principal may get, for views that are not DRF's (whose own
    # throttles count those), per principal: DRF's rate syntax ("120/min"); a 429 problem past it.
    # None (the default): no limit.
    "THROTTLE_RATE": None,
    # 4xx statuses that are not final answers to the request, so never replayed.
    "NOT_STORED_STATUSES": (400, 401, 403, 408, 409, 429),
    # Response headers restored on replay; everything else (Set-Cookie first) is dropped.
    "REPLAYED_HEADERS": (
        "Content-Type",
        "Content-Language",
        "Content-Location",
        "Location",
        "ETag",
        "Last-Modified",
        "Link",
        "Cache-Control",
        "Expires",
        "Vary",
    ),
}

idempotency_settings = AppSettings("IDEMPOTENCY", DEFAULTS, import_strings=("STORE", "SCOPE_RESOLVER"))
