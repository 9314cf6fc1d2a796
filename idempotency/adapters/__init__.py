"""idempotency's adapters: Django's (`django`), DRF's (`drf`) and psycopg's (`psycopg`)
internals, each behind a fallback on the library's public API.

The gate they ask, `internals()`, and `adapters_in_use()` now live in the shared core,
`exactly_once.internals` (the gateway's and the event bus's adapters ask it too); they are
re-exported here, at the path the adapters' page used to name.
"""

from exactly_once.internals import (
    ENVIRONMENT_VARIABLE,
    adapters_in_use,
    forced_off,
    installed,
    internals,
    release,
)

__all__ = ["ENVIRONMENT_VARIABLE", "adapters_in_use", "forced_off", "installed", "internals", "release"]
