"""The storage contract behind the middleware and the decorators: every method they call on a
store, and the values that pass between them and it.

A store answers `acquire` with one of four outcomes and keeps the lease rules: only the
holder of a lease token may `complete` or `fail` the record it leased. A store that can hold a
key by a lock of the work's own transaction instead (`lock_alias` names a database) also
answers `claim`, and then takes the answer with `record_answer` (or `drop`s the claim) inside
that transaction: see idempotency.execution.run_locked. The database store (db.py) keeps both.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from ..responses import StoredResponse


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
class Found:
    """A record as a store read it while claiming its key: what it answers, or what the answer
    written under the claim takes over (compared and set on these fields)."""

    pk: int
    fingerprint: str
    state: str
    lease_token: str
    lease_expires_at: datetime | None
    expires_at: datetime
    response_status: int | None
    response_headers: list
    response_body: bytes | None


@dataclass(frozen=True, slots=True)
class Claim:
    """A key held by the lock of the work's transaction; what its answer is written with."""

    lease: Lease  # token "": no record holds the key while the work runs
    method: str
    path: str
    now: datetime
    replaces: Found | None  # a record the answer takes over (FAILED, dead lease, expired)
    using: str  # the database whose transaction holds the key


@dataclass(frozen=True, slots=True)
class Acquisition:
    outcome: Outcome
    lease: Lease | None = None  # with ACQUIRED
    takeover: bool = False  # acquired from a request whose lease expired
    response: StoredResponse | None = None  # with REPLAY
    expires_at: datetime | None = None  # with REPLAY: the record's expiry
    retry_after: int = 0  # with IN_FLIGHT
    claim: Claim | None = None  # with ACQUIRED by claim() (the key held by a transaction)


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
        (on `aliases`) instead of a durable lease; None: durable leases only (the default), and
        the four methods below are never called."""
        return None

    def claim(
        self,
        *,
        scope: str,
        key: str,
        fingerprint: str,
        ttl_seconds: int,
        method: str = "",
        path: str = "",
        using: str,
    ) -> Acquisition:
        """Inside the work's transaction on `using` (a lock_alias): hold the key until that
        transaction ends. ACQUIRED carries a Claim; any other outcome is the key's answer."""
        raise NotImplementedError(
            "subclasses of BaseStore whose lock_alias() names a database must provide a claim() method"
        )

    def record_answer(self, claim: Claim, response: StoredResponse | None, *, last: bool = False) -> bool:
        """In the claiming transaction: store `response` (COMPLETED), or with None keep the key
        FAILED. False when another request stored first: the caller rolls the work back.
        `last`: nothing else runs in the transaction after this."""
        raise NotImplementedError(
            "subclasses of BaseStore whose lock_alias() names a database must provide a record_answer() method"
        )

    def drop(self, claim: Claim) -> None:
        """In the claiming transaction: the work was refused, the key is free again."""
        raise NotImplementedError(
            "subclasses of BaseStore whose lock_alias() names a database must provide a drop() method"
        )

    def answer_of_winner(self, *, scope: str, key: str, fingerprint: str) -> Acquisition:
        """After record_answer() lost (the work rolled back): the answer the winner's record gives."""
        raise NotImplementedError(
            "subclasses of BaseStore whose lock_alias() names a database must provide an answer_of_winner() method"
        )

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
