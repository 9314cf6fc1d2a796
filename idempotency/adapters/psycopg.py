"""psycopg's internals behind one gate (docs/design/adapters.md): its Transformer, to quote SQL literals.

Tested range: psycopg 3.2 and 3.3 (the gate's range, [3.2, 3.4)). Within it, and unless
`EXACTLY_ONCE_INTERNALS=off`, `literals` takes its fast path; otherwise its fallback, on
psycopg's public API. The path is decided once, when this module is imported (`INTERNALS`).

- `literals` (DatabaseStore.claim and record_answer, idempotency.stores.db, on PostgreSQL).
  The claim sends two statements in one message, which takes the simple query protocol, which
  has no parameters: psycopg quotes the values as SQL literals (the answer's INSERT is built
  the same way, so that the COMMIT may ride in its message). Internals: one
  `psycopg.adapt.Transformer` per connection, kept on Django's connection wrapper (a thread's
  own) and asked for `as_literal()` (the adaptation API documents the class as one for
  psycopg's internal use). Why: `psycopg.sql.quote()` builds a Transformer per value, 3.5x the
  CPU. Fallback: `psycopg.sql.Literal(value).as_string(connection)`, the same literal text
  (Literal adapts through a Transformer of the connection's context), one Transformer per
  value.

Not internals, kept on both paths: several statements in one `execute()` without parameters
and `Cursor.nextset()` to reach the second's rows (psycopg documents both: "Multiple statements
in the same query"); `ConnectionInfo.encoding`. The COMMIT that the answer's INSERT may carry
depends on Django's transaction state: that is the Django adapter's `ends_transaction`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from exactly_once.internals import internals

INTERNALS = internals("psycopg", "psycopg", "3.2", "3.4")


def _literals_internals(connection, values: Sequence) -> tuple[str, ...]:
    raw = connection.connection
    kept = getattr(connection, "_idempotency_transformer", None)
    if kept is None or kept[0] is not raw:  # none yet, or Django reconnected since
        from psycopg.adapt import Transformer

        kept = connection._idempotency_transformer = (raw, Transformer(raw))
    transformer, encoding = kept[1], raw.info.encoding
    return tuple(transformer.as_literal(value).decode(encoding) for value in values)


def _literals_public(connection, values: Sequence) -> tuple[str, ...]:
    from psycopg import sql

    raw = connection.connection
    return tuple(sql.Literal(value).as_string(raw) for value in values)


literals: Callable[[object, Sequence], tuple[str, ...]]
"""literals(connection, values): `values` as SQL literals for `connection` (Django's, on
psycopg 3), in order."""

literals = _literals_internals if INTERNALS else _literals_public
