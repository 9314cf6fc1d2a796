"""Keyed enqueues: a caller that retries gets the same TaskResult back and the task runs once.

    with enqueue_key(f"receipt-{order.pk}", owner=request.user):
        send_receipt.enqueue(order.pk)

Each enqueue inside the block is keyed from the block's key and its place in the block (the
first `<key>:1`, the next `<key>:2`...): the same code run again enqueues nothing new. A view
run under an Idempotency-Key (the middleware, @idempotency_key, @idempotent) is such a block
already, keyed by the request's key, owned by its user: a client's retry never enqueues twice
(idempotency.context). Outside any block an enqueue is a new task each time.
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager

from idempotency.context import current_work, keyed_work
from idempotency.keys import IdemKey
from idempotency.scope import join_scope

# The enqueues' keys are kept apart from the keys of the work they are made in (a request's
# scope, the owner's): under ("tasks", "eventbus", that scope), three parts where a request's
# scope joins two (idempotency.scope), so no request's own key can take one first.
TASKS_SCOPE_PREFIX = ("tasks", "eventbus")


@contextmanager
def enqueue_key(key: str, *, owner=None):
    """Key every django.tasks enqueue in the block from `key` (see the module doc).

    Parameters
    ----------
    key : str
        The block's key, unique per owner and operation: e.g. `f"receipt-{order.pk}"`.
    owner : User, optional
        Who owns the tasks (they list them in the jobs API, watch them, cancel them); None:
        nobody (staff see them).

    Examples
    --------
    >>> with enqueue_key("receipt-42"):  # doctest: +SKIP
    ...     send_receipt.enqueue(42)
    """
    from eventbus.services import owner_scope

    idem_key = IdemKey(str(key))  # the rules of every idempotency key (InvalidKey)
    with keyed_work(owner_scope(owner), idem_key.value, owner=owner):
        yield


def next_key() -> tuple[str, str, object]:
    """(scope, key, owner) of an enqueue now: derived from the keyed work being run (an
    enqueue_key block, a keyed request or call), else a new key, ownerless."""
    from eventbus.services import OWNERLESS_SCOPE

    work = current_work()
    if work is None:
        return OWNERLESS_SCOPE, f"task:{uuid.uuid4().hex}", None
    return join_scope(*TASKS_SCOPE_PREFIX, work.scope), work.derive(), work.owner
