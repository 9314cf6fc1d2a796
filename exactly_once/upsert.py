"""INSERT ... ON CONFLICT as one statement, on SQLite (3.24+) and PostgreSQL, the databases the
toolkit runs on. Django's bulk_create(ignore_conflicts=...) says nothing of which rows went in,
and its update_conflicts cannot spare the rows a condition protects; this does both:

- no `update_unless`: ON CONFLICT DO NOTHING; the row count says whether the rows went in
  (accept_once() inserts its row so, with no savepoint around a failing INSERT);
- `update_unless="finished_at"`: ON CONFLICT DO UPDATE every other column WHERE that column
  IS NULL (eventbus.job.stagerecords: a finished stage is never written again).

Fields are prepared as the ORM saves them (get_db_prep_save); no model signal is sent.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from django.db import connections, router
from django.db.models import Field, Model


def column(model: type[Model], name: str) -> str:
    """The database column of the model's field `name` (a concrete field)."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.column is not None, name
    return field.column


def insert_statement(
    objs: Sequence[Model], *, target: tuple[str, ...], update_unless: str | None = None
) -> tuple[str, list, str]:
    """(sql, params, database alias) of insert(); the caller may append a RETURNING clause."""
    model = type(objs[0])
    alias = router.db_for_write(model)
    connection = connections[alias]
    fields = _fields(model)
    sql = _insert_sql(model, alias, target, update_unless, len(objs))
    params = [f.get_db_prep_save(f.pre_save(obj, add=True), connection) for obj in objs for f in fields]
    return sql, params, alias


@functools.cache
def _fields(model: type[Model]) -> tuple[Field, ...]:
    return tuple(f for f in model._meta.concrete_fields if not (f.primary_key and f.auto_created))


# The text depends only on these arguments: built once each (a stage's finish writes one such
# statement per stage of every job; building it quoted ~40 names each time).
@functools.cache
def _insert_sql(
    model: type[Model], alias: str, target: tuple[str, ...], update_unless: str | None, rows: int
) -> str:
    quote = connections[alias].ops.quote_name
    fields = _fields(model)
    table = quote(model._meta.db_table)
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    sql = (
        f"INSERT INTO {table} ({', '.join(quote(column(model, f.name)) for f in fields)}) "
        f"VALUES {', '.join([row] * rows)} "
        f"ON CONFLICT ({', '.join(quote(column(model, name)) for name in target)}) "
    )
    if update_unless is None:
        return sql + "DO NOTHING"
    updated = [column(model, f.name) for f in fields if f.name not in target and not f.primary_key]
    return sql + (
        f"DO UPDATE SET {', '.join(f'{quote(c)} = excluded.{quote(c)}' for c in updated)} "
        f"WHERE {table}.{quote(column(model, update_unless))} IS NULL"
    )


def insert(objs: Sequence[Model], *, target: tuple[str, ...], update_unless: str | None = None) -> int:
    """Insert `objs` (one model) in one statement; returns how many rows it wrote. A row whose
    `target` fields (a unique constraint's) are taken is skipped or, with `update_unless`,
    updated unless that field is set."""
    if not objs:
        return 0
    sql, params, alias = insert_statement(objs, target=target, update_unless=update_unless)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
