"""Library internals behind adapters: the one gate every adapter asks (the design page
"Adapters", docs/design/adapters.md). It lives in the shared core because the adapters of all
three apps ask it: idempotency's (Django, DRF, psycopg), eventbus's (redis-py, Celery) and the
gateway's (channels, uvicorn).

A few fast paths reach into what a library does not promise to keep (redis-py's connections,
uvicorn's protocol, channels' session wrapper, Django's ORM compiler and request internals,
psycopg's adapters, DRF's forced authentication). Each sits in one adapter module, beside a
fallback written against the library's public API, and takes the fast path only when
`internals()` says so: the installed release lies in the range the version matrix tests
(`noxfile.py`), and the fallback is not forced.

`EXACTLY_ONCE_INTERNALS=off` in the environment forces every fallback: the matrix runs the
whole suite that way too, so both paths are tested. A release outside the tested range takes
the fallback by itself: slower, never wrong. `adapters_in_use()` says which path each adapter
took (the test suite prints it in its header, so each leg of the matrix shows what it ran).
"""

from __future__ import annotations

import functools
import os
import re
from importlib.metadata import PackageNotFoundError, version

ENVIRONMENT_VARIABLE = "EXACTLY_ONCE_INTERNALS"

# adapter name -> whether it takes its fast path; filled as the adapters are first asked.
_decisions: dict[str, bool] = {}


def release(text: str) -> tuple[int, ...]:
    """A version string's release numbers: "5.2.19" -> (5, 2, 19), "6.1rc1" -> (6, 1)."""
    numbers = []
    for part in text.split("."):
        digits = re.match(r"\d*", part).group()  # type: ignore[union-attr]
        if not digits:
            break
        numbers.append(int(digits))
        if digits != part:
            break
    return tuple(numbers)


def forced_off() -> bool:
    return os.environ.get(ENVIRONMENT_VARIABLE, "on").strip().lower() in ("off", "0", "false", "no")


@functools.cache
def installed(distribution: str) -> tuple[int, ...] | None:
    try:
        return release(version(distribution))
    except PackageNotFoundError:
        return None


def internals(adapter: str, distribution: str, lowest: str, below: str) -> bool:
    """Whether `adapter` may use `distribution`'s internals: its installed release is within
    [lowest, below), the range the matrix tests, and the environment does not force the
    public API. Asked once per adapter, at import or first use."""
    found = installed(distribution)
    allowed = not forced_off() and found is not None and release(lowest) <= found < release(below)
    _decisions[adapter] = allowed
    return allowed


def adapters_in_use() -> dict[str, str]:
    """Each adapter asked so far and the path it took: "internals" or "public API"."""
    return {name: "internals" if fast else "public API" for name, fast in sorted(_decisions.items())}
