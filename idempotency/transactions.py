"""Transactions that hold SQLite's write lock from their start: `write_transaction`.

A SQLite transaction is DEFERRED unless the database's OPTIONS say otherwise (Django's
`transaction_mode`): BEGIN takes no lock, the first read takes a shared lock, and the first
write must then upgrade it. SQLite never retries that upgrade under its busy timeout (two
readers each waiting for the other to let go would deadlock): while another connection writes,
it fails at once with "database is locked". A transaction whose first statement writes waits
for the lock like any other statement, up to the timeout.

A keyed request's transaction reads first (its authentication, the view's reads) and writes
after (its rows, the answer), and twenty of them at once made SQLite projects answer half of
them 503. So the toolkit's transactions begin, on such a database, with a write that changes
nothing. Where every transaction is IMMEDIATE already (what the check idempotency.W002 asks of
a SQLite project, for its own transactions too), and on any other database (PostgreSQL), this
is `transaction.atomic` and not one statement more.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS, connections, router, transaction

from exactly_once.upsert import column

from .adapters.django import in_transaction
from .models import IdempotencyRecord

# The modes whose BEGIN takes the write lock itself.
LOCKING_MODES = frozenset({"IMMEDIATE", "EXCLUSIVE"})


def defers_write_lock(connection) -> bool:
    """Whether a transaction on `connection` (a Django database wrapper, connected or not) takes
    SQLite's write lock only at its first write."""
    if connection.vendor != "sqlite":
        return False
    mode = (connection.settings_dict.get("OPTIONS") or {}).get("transaction_mode") or "DEFERRED"
    return str(mode).upper() not in LOCKING_MODES


@contextmanager
def write_transaction(using: str | None = None) -> Iterator[None]:
    """`transaction.atomic(using=using)` that, when it begins the transaction on a SQLite
    database that defers the write lock, takes that lock first, waiting for it as long as the
    database's `timeout` allows. Inside a transaction already open it is a savepoint only: the
    transaction's lock is its opener's affair."""
    using = using or DEFAULT_DB_ALIAS
    lock = (
        defers_write_lock(connections[using])
        and not in_transaction(using)
        and router.allow_migrate_model(using, IdempotencyRecord)
    )
    with transaction.atomic(using=using):
        if lock:
            _take_write_lock(using)
        yield


def _take_write_lock(using: str) -> None:
    # Any write statement takes the lock, even one that matches no row; the record table is
    # the one table the toolkit knows is on the database.
    quote = connections[using].ops.quote_name
    table, pk = IdempotencyRecord._meta.db_table, column(IdempotencyRecord, "id")
    with connections[using].cursor() as cursor:
        cursor.execute(f"UPDATE {quote(table)} SET {quote(pk)} = {quote(pk)} WHERE 0")
