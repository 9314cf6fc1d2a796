"""The command store: accept a command once per (scope, key)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from .exceptions import IdempotencyKeyMismatch
from .keys import IdemKey
from .models import Operation


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


def accept(
    command: Command, *, on_accepted: Callable[[Operation], None] | None = None
) -> tuple[Operation, bool]:
    """The Operation of this (scope, key), created if new: (operation, created).

    Race-safe on the UNIQUE constraint: concurrent accepts of one key get one op_id, and
    `on_accepted` (enqueue the work) runs once, after the creating transaction commits.
    The same key with another domain, event type or payload raises IdempotencyKeyMismatch.
    """
    try:
        with transaction.atomic():
            operation = Operation.objects.create(
                scope=command.scope,
                idem_key=command.idem_key.value,
                domain=command.domain,
                event_type=command.event_type,
                payload=command.payload,
                biz_key=command.biz_key,
                owner=command.owner,
                deadline=command.deadline,
            )
    except IntegrityError:
        operation = Operation.objects.get(scope=command.scope, idem_key=command.idem_key.value)
        if (operation.domain, operation.event_type, operation.payload) != (
            command.domain,
            command.event_type,
            command.payload,
        ):
            raise IdempotencyKeyMismatch(  # noqa: B904 (the IntegrityError is the expected path, not a cause)
                f"Key {command.idem_key} was accepted before for another command (operation {operation.op_id})."
            )
        return operation, False
    if on_accepted is not None:
        transaction.on_commit(lambda: on_accepted(operation))
    return operation, True
