"""Accept once: insert a row once per (scope, key), whatever the model, and read back the winner.

    job, created = accept_once(
        Job(scope=scope, idem_key=key.value, domain="scan", payload={...}),
        unique=("scope", "idem_key"),
        same=("domain", "event_type", "payload"),
        on_accepted=enqueue,
    )

The model needs a UNIQUE constraint on the `unique` fields. The row goes in with one
INSERT ... ON CONFLICT DO NOTHING (exactly_once.upsert); when the key is taken, the winner is
read back and must hold what the row holds in the `same` fields, or the key was used for
another request (IdempotencyKeyMismatch). The job services (eventbus.services) accept jobs so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TypeVar

from django.core.exceptions import BadRequest
from django.db import IntegrityError, models, transaction

from exactly_once.jsontext import json_unstorable, nested_deeper_than, text_is_unicode
from exactly_once.upsert import insert

from .exceptions import IdempotencyKeyMismatch

Row = TypeVar("Row", bound=models.Model)


class UnstorableRow(BadRequest, ValueError):
    """A row no database stores alike: a NUL character in a text or JSON field (SQLite keeps it,
    PostgreSQL's text and jsonb refuse it), a lone surrogate (SQLite keeps it, then every page
    that shows the row fails to encode it), NaN or infinity, or JSON nested too deep to
    serialise. A BadRequest, so that a view that lets it through answers 400, and its
    Idempotency-Key is free again."""


def accept_once(
    row: Row,
    *,
    unique: Sequence[str] = ("scope", "idem_key"),
    same: Sequence[str] = (),
    on_accepted: Callable[[Row], None] | None = None,
) -> tuple[Row, bool]:
    """The row of its `unique` fields' values, inserted if new: (row, created).

    Race-safe on the model's UNIQUE constraint over `unique`: concurrent accepts of one key get
    one row, and `on_accepted` runs once, after the creating transaction commits.

    Parameters
    ----------
    row : Model
        An unsaved instance: the row to insert.
    unique : sequence of str
        The fields of the model's UNIQUE constraint (by default ("scope", "idem_key")).
    same : sequence of str
        The fields the row already stored must share with `row` (a foreign key compared by its
        id).
    on_accepted : callable, optional
        Called with the row once, after the transaction that created it commits (enqueue the
        work).

    Returns
    -------
    tuple of (Model, bool)
        The stored row, and whether this call created it.

    Raises
    ------
    IdempotencyKeyMismatch
        When the stored row's `same` fields differ from `row`'s.
    UnstorableRow
        For a NUL character, a lone surrogate, NaN or JSON nested too deep (nothing is stored).
    """
    _check_storable(row)
    # ON CONFLICT DO NOTHING: a taken key is no error, so no savepoint guards the INSERT (two
    # round trips fewer inside the caller's transaction: an atomic view, an Idempotency-Key's).
    meta = row._meta
    key = {name: getattr(row, _attname(row, name)) for name in unique}
    if insert([row], target=tuple(unique)):
        row._state.adding = False
        if row.pk is None:  # a database-assigned key (AutoField), which the INSERT does not return
            row.pk = type(row)._default_manager.filter(**key).values_list("pk", flat=True).get()
        if on_accepted is not None:
            transaction.on_commit(lambda: on_accepted(row))
        return row, True
    # The key's winner (a committed row: the INSERT waited for it). Its request must be this one.
    winner = type(row)._default_manager.filter(**key).first()
    if winner is None:
        raise IntegrityError(f"Key {key} is taken by a {meta.verbose_name} this transaction cannot see.")
    attnames = [_attname(row, name) for name in same]
    if [getattr(winner, name) for name in attnames] != [getattr(row, name) for name in attnames]:
        raise IdempotencyKeyMismatch(
            f"Key {key[unique[-1]]} was accepted before for another request ({meta.verbose_name} {winner.pk})."
        )
    return winner, False


def _attname(row: models.Model, name: str) -> str:
    """The attribute holding the field's value (a foreign key's: its id)."""
    field = row._meta.get_field(name)
    assert isinstance(field, models.Field), name
    return field.attname


def _check_storable(row: models.Model) -> None:
    for field in row._meta.concrete_fields:
        value = getattr(row, field.attname)
        if isinstance(field, models.JSONField):
            _check_json(field.name, value)
        elif isinstance(value, str) and "\x00" in value:
            raise UnstorableRow(f"The {field.name} holds a NUL character.")
        elif isinstance(value, str) and not text_is_unicode(value):
            raise UnstorableRow(f"The {field.name} holds a lone surrogate (not Unicode text).")


def _check_json(name: str, value) -> None:
    try:
        # As JSONField serialises it (types it cannot take are the ORM's error, not this one).
        serialised = json.dumps(value, default=str, allow_nan=False)
    except RecursionError:
        raise UnstorableRow(f"The {name} is nested too deep to store.") from None
    except ValueError as exc:
        if "Circular reference" in str(exc):
            return  # a circular value: the ORM refuses it as it always did
        # 1e999 parses to inf: jsonb and SQLite's JSON_VALID refuse it.
        raise UnstorableRow(f"The {name} holds a number JSON cannot carry (NaN or infinity).") from None
    if nested_deeper_than(value, serialised):
        raise UnstorableRow(f"The {name} is nested too deep to store.")
    if (what := json_unstorable(serialised)) is not None:
        raise UnstorableRow(f"The {name} holds {what}.")
