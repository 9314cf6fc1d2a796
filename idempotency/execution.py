"""Running a request or a call while holding its key's lease, shared by the middleware and
the @idempotent decorator.

When the work runs in a transaction, its answer is stored inside that same transaction:
a crash or rollback leaves either the work's effects with a COMPLETED record, or neither.
Never a completed record without the effects, and never effects that a retry would repeat.

Two ways to hold the key meanwhile (see stores/db.py): on PostgreSQL, when that transaction is
on the record's database, a lock of the transaction and one INSERT of the answer in it
(`run_locked`): a rollback leaves nothing behind, not even a lease. Elsewhere a durable lease,
committed before the work and renewed while it runs (`run_leased`): a rollback leaves it
PENDING, and a retry takes it over once it expires.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

from django.db import router, transaction

from .adapters.django import atomic_request_databases
from .exceptions import LeaseLost
from .heartbeat import keeper
from .keys import IdemKey
from .models import IdempotencyRecord
from .responses import StoredResponse
from .stores.base import Acquisition, BaseStore, Lease, Outcome
from .transactions import write_transaction

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IdempotencyContext:
    """Set on the request as `request.idempotency` while a keyed request runs."""

    scope: str
    key: IdemKey
    lease: Lease  # its token is "" when the key is held by the view's transaction (run_locked)
    takeover: bool


def transaction_aliases(view_func, *, atomic: bool) -> list[str]:
    """The databases the work runs in a transaction on: those with ATOMIC_REQUESTS (as
    Django's handler would wrap the view), plus the store's when `atomic` is asked for."""
    aliases = atomic_request_databases(view_func)
    if atomic:
        record_alias = router.db_for_write(IdempotencyRecord)
        if record_alias not in aliases:
            aliases.append(record_alias)
    return aliases


class Verdict(enum.Enum):
    """What becomes of a key whose work produced no answer to store."""

    FAIL = "fail"  # effects may exist: the same request may run again, another one is refused
    RELEASE = "release"  # refused before any effect: the key is free again, fingerprint included


@dataclass(frozen=True, slots=True)
class Ran:
    result: object
    stored: bool  # False: the answer could not be stored and the work's effects stand


def run_leased(
    store: BaseStore,
    lease: Lease,
    work: Callable[[], object],
    to_stored: Callable[[object], StoredResponse | Verdict],
    *,
    aliases: list[str],
    lease_seconds: int,
    on_error: Callable[[BaseException], Verdict] = lambda exc: Verdict.FAIL,
) -> Ran:
    """Run `work` under `lease`, renewed while it runs, and store `to_stored(result)` (or settle
    the key by its Verdict). Raises LeaseLost, rolling the work back, when the work ran in a
    transaction and another request took the key over meanwhile. Outside a transaction the
    effects stand whatever happens to the answer: `Ran.stored` says whether it was stored.
    An exception from the work settles the key by `on_error(exc)` (after any rollback) and
    propagates."""
    stored = True
    with keeper.hold(store, lease, lease_seconds):
        try:
            with ExitStack() as stack:
                for alias in aliases:
                    # On SQLite, the write lock first: the work reads before it writes.
                    stack.enter_context(write_transaction(alias))
                result = work()
                answer = to_stored(result)
                if isinstance(answer, StoredResponse):
                    stored = _complete(store, lease, answer, in_transaction=bool(aliases))
        except BaseException as exc:
            _settle(store.release if on_error(exc) is Verdict.RELEASE else store.fail, lease)
            raise
    if not isinstance(answer, StoredResponse):
        _settle(store.release if answer is Verdict.RELEASE else store.fail, lease)
    return Ran(result, stored)


class _AnsweredFirst(Exception):
    """Another request stored an answer under the key first: the work is rolled back."""

    def __init__(self, lease: Lease):
        super().__init__(lease)
        self.lease = lease


def run_locked(
    store: BaseStore,
    claim: Callable[[], Acquisition],
    work: Callable[[Acquisition], object],
    to_stored: Callable[[object], StoredResponse | Verdict],
    *,
    aliases: list[str],
) -> Acquisition | Ran:
    """Run `work` in a transaction on `aliases` that first holds its key (`claim()`, e.g. the
    store's claim on its lock_alias) and last stores `to_stored(result)`, all in that same
    transaction. Returns the Acquisition instead when the key's record answers (replay,
    mismatch, in flight), also when another request stored first (the work rolled back).

    Verdicts: an answer is stored COMPLETED; FAIL (a 5xx, a streamed body: the work's effects
    commit) keeps the key FAILED; RELEASE stores nothing. An exception rolls everything back and
    propagates, storing nothing: there are no effects, so the key stays as it was (free)."""
    try:
        with ExitStack() as stack:
            for alias in aliases:
                stack.enter_context(transaction.atomic(using=alias))
            acquisition = claim()
            if acquisition.outcome is not Outcome.ACQUIRED:
                return acquisition
            held = acquisition.claim
            assert held is not None
            result = work(acquisition)
            answer = to_stored(result)
            if answer is Verdict.RELEASE:
                store.drop(held)
            elif not store.record_answer(
                held, answer if isinstance(answer, StoredResponse) else None, last=len(aliases) == 1
            ):
                raise _AnsweredFirst(held.lease)
    except _AnsweredFirst as lost:
        lease = lost.lease
        return store.answer_of_winner(scope=lease.scope, key=lease.key, fingerprint=lease.fingerprint)
    return Ran(result, stored=True)


def _complete(store: BaseStore, lease: Lease, answer: StoredResponse, *, in_transaction: bool) -> bool:
    if in_transaction:
        # A failure raises and rolls the work back with the answer: a retry is safe.
        if not store.complete(lease, answer):
            raise LeaseLost(
                "This request outlived its lease and a retry took the key over; its effects were rolled back."
            )
        return True
    # Outside a transaction the effects stand: the client gets its answer even when it cannot be
    # stored, rather than an error that invites a retry into a second execution.
    try:
        if store.complete(lease, answer):
            return True
        logger.warning(
            "idempotency lease of %s %s lost to a retry; this answer is not stored", lease.scope, lease.key
        )
    except Exception:
        logger.exception(
            "idempotency answer of %s %s could not be stored; the client gets it unstored",
            lease.scope,
            lease.key,
        )
    return False


def _settle(end: Callable[[Lease], bool], lease: Lease) -> None:
    """Fail or release a key. Bookkeeping never replaces the work's own answer or error: if the
    database refuses, the lease simply expires."""
    try:
        end(lease)
    except Exception:
        logger.exception(
            "idempotency lease of %s %s could not be settled; it expires by itself", lease.scope, lease.key
        )
