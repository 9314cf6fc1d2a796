"""The command store: accept a command once per (scope, key)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.exceptions import BadRequest
from django.db import IntegrityError, transaction

from .exceptions import IdempotencyKeyMismatch
from .jsontext import json_holds_nul, nested_deeper_than
from .keys import IdemKey
from .models import Operation
from .upsert import insert


class InvalidCommand(BadRequest, ValueError):
    """A command no database stores alike: a NUL character (SQLite keeps it, PostgreSQL's text
    and jsonb refuse it), NaN or infinity, or a payload nested too deep to serialise. A BadRequest, so that a
    view that lets it through answers 400, and its Idempotency-Key is free again."""


@dataclass(frozen=True, kw_only=True)
class Command:
    scope: str
    idem_key: IdemKey
    domain: str
    event_type: str
    payload: dict = field(default_factory=dict)
    biz_key: str = ""
    owner: Any = None
    deadline: datetime | None = None
    # The job this command retries (eventbus.retry_job): part of what the key stands for.
    retry_of: Operation | None = None


def accept(
    command: Command, *, on_accepted: Callable[[Operation], None] | None = None
) -> tuple[Operation, bool]:
    """The Operation of this (scope, key), created if new: (operation, created).

    Race-safe on the UNIQUE constraint: concurrent accepts of one key get one op_id, and
    `on_accepted` (enqueue the work) runs once, after the creating transaction commits.
    The same key with another domain, event type or payload raises IdempotencyKeyMismatch;
    a NUL character or a payload nested too deep, InvalidCommand (nothing is stored).
    """
    _check_storable(command)
    operation = Operation(
        scope=command.scope,
        idem_key=command.idem_key.value,
        domain=command.domain,
        event_type=command.event_type,
        payload=command.payload,
        biz_key=command.biz_key,
        owner=command.owner,
        deadline=command.deadline,
        retry_of=command.retry_of,
    )
    # ON CONFLICT DO NOTHING: a taken key is no error, so no savepoint guards the INSERT (two
    # round trips fewer inside the caller's transaction: an atomic view, an Idempotency-Key's).
    if insert([operation], target=("scope", "idem_key")):
        operation._state.adding = False
        if on_accepted is not None:
            transaction.on_commit(lambda: on_accepted(operation))
        return operation, True
    # The key's winner (a committed row: the INSERT waited for it). Its command must be this one.
    winner = Operation.objects.filter(scope=command.scope, idem_key=command.idem_key.value).first()
    if winner is None:
        raise IntegrityError(f"Key {command.idem_key} is taken by an operation this transaction cannot see.")
    if (winner.domain, winner.event_type, winner.payload, winner.retry_of_id) != (
        command.domain,
        command.event_type,
        command.payload,
        command.retry_of.pk if command.retry_of is not None else None,
    ):
        raise IdempotencyKeyMismatch(
            f"Key {command.idem_key} was accepted before for another command (operation {winner.op_id})."
        )
    return winner, False


def _check_storable(command: Command) -> None:
    texts = {
        "scope": command.scope,
        "idem_key": command.idem_key.value,
        "domain": command.domain,
        "event_type": command.event_type,
        "biz_key": command.biz_key,
    }
    for name, text in texts.items():
        if "\x00" in text:
            raise InvalidCommand(f"The command's {name} holds a NUL character.")
    try:
        # As JSONField serialises it (types it cannot take are the ORM's error, not this one).
        serialised = json.dumps(command.payload, default=str, allow_nan=False)
    except RecursionError:
        raise InvalidCommand("The command's payload is nested too deep to store.") from None
    except ValueError as exc:
        if "Circular reference" in str(exc):
            return  # a circular payload: the ORM refuses it as it always did
        # 1e999 parses to inf: jsonb and SQLite's JSON_VALID refuse it.
        raise InvalidCommand(
            "The command's payload holds a number JSON cannot carry (NaN or infinity)."
        ) from None
    if nested_deeper_than(command.payload, serialised):
        raise InvalidCommand("The command's payload is nested too deep to store.")
    if json_holds_nul(serialised):
        raise InvalidCommand("The command's payload holds a NUL character (\\u0000).")
