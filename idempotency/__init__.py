"""Idempotency-Key for Django: a request or a call under one key runs once, and its retries get
its first answer.

Its public API, importable from here: the view marker `idempotency_key` and the function
decorator `idempotent` (with `GLOBAL`), the middleware (`IdempotencyMiddleware`, listed in
MIDDLEWARE as idempotency.middleware.IdempotencyMiddleware), the generic accept-once of a row
per (scope, key) (`accept_once`, `UnstorableRow`: eventbus accepts its jobs with it), keys
(`IdemKey`, `InvalidKey`), the errors a caller catches, and what the settings name: DRF's `TokenAuthentication` with its lookup compiled once, the problem
`drf_exception_handler`, the default `UserScopeResolver`. Each is imported on first use: Django
imports the package (INSTALLED_APPS) before its app registry is ready, so importing it must not
pull in models or settings.
"""

_EXPORTS = {
    "idempotency_key": "idempotency.decorators",
    "idempotent": "idempotency.decorators",
    "GLOBAL": "idempotency.decorators",
    "IdempotencyMiddleware": "idempotency.middleware",
    "accept_once": "idempotency.services",
    "UnstorableRow": "idempotency.services",
    "IdemKey": "idempotency.keys",
    "InvalidKey": "idempotency.keys",
    "IdempotencyError": "idempotency.exceptions",
    "IdempotencyKeyMissing": "idempotency.exceptions",
    "IdempotencyKeyInvalid": "idempotency.exceptions",
    "IdempotencyKeyMismatch": "idempotency.exceptions",
    "IdempotencyInProgress": "idempotency.exceptions",
    "LeaseLost": "idempotency.exceptions",
    "DatabaseUnavailable": "idempotency.exceptions",
    "TokenAuthentication": "idempotency.authentication",
    "drf_exception_handler": "idempotency.problems",
    "UserScopeResolver": "idempotency.scope",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'idempotency' has no attribute {name!r}")
