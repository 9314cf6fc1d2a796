"""The storage contract behind the middleware and the decorators.

A store answers `acquire` with one of four outcomes and keeps the lease rules: only the
holder of a lease token may `complete` or `fail` the record it leased.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.utils import timezone

from ..responses import StoredResponse

if TYPE_CHECKING:
    from .db import Claim


class Outcome(enum.Enum):
    ACQUIRED = "acquired"  # run the request, then complete() or fail() with the token
    REPLAY = "replay"  # a completed record with the same fingerprint: answer with its response
    IN_FLIGHT = "in_flight"  # another request holds a live lease
    MISMATCH = "mismatch"  # the key was used for another request


@dataclass(frozen=True, slots=True)
class Lease:
    """What the holder of a key needs to complete or fail it."""

    scope: str
    key: str
    token: str
    fingerprint: str
    expires_at: datetime  # when the record itself expires


@dataclass(frozen=True, slots=True)
class Acquisition:
    outcome: Outcome
    lease: Lease | None = None  # with ACQUIRED
    takeover: bool = False  # acquired from a request whose lease expired
    response: StoredResponse | None = None  # with REPLAY
    expires_at: datetime | None = None  # with REPLAY: the record's expiry
    retry_after: int = 0  # with IN_FLIGHT
    claim: Claim | None = None  # with ACQUIRED by DatabaseStore.claim (the key held by a transaction)


class BaseStore:
    # The clock, swappable in tests (as DRF's throttles do with `timer`).
    now = staticmethod(timezone.now)

    def acquire(
        self,
        *,
        scope: str,
        key: str,
        fingerprint: str,
        lease_seconds: int,
        ttl_seconds: int,
        method: str = "",
        path: str = "",
    ) -> Acquisition:
        raise NotImplementedError("subclasses of BaseStore must provide an acquire() method")

    def cached(self, *, scope: str, key: str, fingerprint: str) -> Acquisition | None:
        """A REPLAY or MISMATCH known without asking the database (a cache); None: ask it."""
        return None

    def lock_alias(self, aliases: list[str]) -> str | None:
        """The database on which this store can hold a key by a lock of the work's transaction
        (on `aliases`) instead of a durable lease; None: durable leases only (the default)."""
        return None

    def complete(self, lease: Lease, response: StoredResponse) -> bool:
        """Store the answer if the lease is still held; False when it was taken over."""
        raise NotImplementedError("subclasses of BaseStore must provide a complete() method")

    def fail(self, lease: Lease) -> bool:
        """End the lease without an answer: a retry with the same request executes again, and
        another request under the key is still refused (the failed attempt may have had effects)."""
        raise NotImplementedError("subclasses of BaseStore must provide a fail() method")

    def release(self, lease: Lease) -> bool:
        """Forget the key as if it had never been used: the request was refused before it did
        anything (a 400, 401, 403...), so a corrected request may use the key."""
        raise NotImplementedError("subclasses of BaseStore must provide a release() method")

    def renew(self, lease: Lease, lease_seconds: int) -> bool:
        """Extend a held lease by `lease_seconds` from now; False when it is no longer held."""
        raise NotImplementedError("subclasses of BaseStore must provide a renew() method")

    def evict(self, *, scope: str, key: str) -> None:
        """Forget the key at once (admin action)."""
        raise NotImplementedError("subclasses of BaseStore must provide an evict() method")

    def forget(self, *, scope: str, key: str) -> None:
        """Drop any copy kept outside the database (after the record was expired there)."""

    @classmethod
    def clear_expired(cls) -> int:
        """Delete expired records; returns how many. The cleanup command's hook."""
        raise NotImplementedError("subclasses of BaseStore must provide a clear_expired() method")
