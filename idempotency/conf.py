"""IDEMPOTENCY's settings: their defaults and their accessor.

    from idempotency.conf import idempotency_settings
    idempotency_settings.TTL

The accessor is an `exactly_once.conf.AppSettings` (the shared core's, which eventbus.conf and
gateway.conf build on too): defaults fill what the project leaves out, STORE and SCOPE_RESOLVER
are imported from their dotted paths, unknown keys are refused, and `override_settings` takes
effect.
"""

from exactly_once.conf import AppSettings

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
