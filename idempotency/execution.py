"""Running a request or a call while holding its key's lease, shared by the middleware and
the @idempotent decorator.

When the work runs in a transaction, its answer is stored inside that same transaction:
a crash or rollback leaves either the work's effects with a COMPLETED record, or neither
(a PENDING lease a retry takes over once it expires). Never a completed record without the
effects, and never effects that a retry would repeat.
"""
from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable

from django.db import connections, router, transaction

from .exceptions import LeaseLost
from .keys import IdemKey
from .models import IdempotencyRecord
from .responses import StoredResponse
from .stores.base import BaseStore, Lease

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IdempotencyContext:
    """Set on the request as `request.idempotency` while a keyed request runs."""

    scope: str
    key: IdemKey
    lease: Lease
    takeover: bool


def transaction_aliases(view_func, *, atomic: bool) -> list[str]:
    """The databases the work runs in a transaction on: those with ATOMIC_REQUESTS (as
    Django's handler would wrap the view), plus the store's when `atomic` is asked for."""
    non_atomic = getattr(view_func, "_non_atomic_requests", set())
    aliases = [a for a, s in connections.settings.items() if s.get("ATOMIC_REQUESTS") and a not in non_atomic]
    if atomic:
        record_alias = router.db_for_write(IdempotencyRecord)
        if record_alias not in aliases:
            aliases.append(record_alias)
    return aliases


def run_leased(
    store: BaseStore,
    lease: Lease,
    work: Callable[[], object],
    to_stored: Callable[[object], StoredResponse | None],
    *,
    aliases: list[str],
):
    """Run `work` under `lease` and store `to_stored(result)` (None: not storable, the key
    is released for a retry). Raises LeaseLost, rolling the work back, when the work ran in
    a transaction and another request took the key over meanwhile."""
    stored = None
    try:
        with ExitStack() as stack:
            for alias in aliases:
                stack.enter_context(transaction.atomic(using=alias))
            result = work()
            stored = to_stored(result)
            if stored is not None and not store.complete(lease, stored):
                if aliases:
                    raise LeaseLost("This request outlived its lease and a retry took the key over; "
                                    "its effects were rolled back.")
                # Outside a transaction the effects stand; the new owner's answer is kept.
                logger.warning("idempotency lease of %s %s lost; answer not stored", lease.scope, lease.key)
    except BaseException:
        store.fail(lease)
        raise
    if stored is None:
        store.fail(lease)
    return result
