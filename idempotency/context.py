"""The keyed work being run (a request under an Idempotency-Key, an @idempotent call), for code
deeper down that must be keyed from it: each django.tasks enqueue of a keyed request
(eventbus.djangotasks.keys) takes a key derived from the request's, deterministically, so a
client's retry that runs the view again enqueues nothing new.

    with keyed_work(scope, key, owner=request.user):
        view(request)                 # current_work() is that work, its derive() counts
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from .keys import MAX_LENGTH


@dataclass
class KeyedWork:
    """One keyed piece of work: its scope and key, its owner (the request's user, or None), and
    a counter of the keys derived from it."""

    scope: str
    key: str
    owner: object = None
    _counter: Iterator[int] = field(default_factory=lambda: itertools.count(1), repr=False)

    def derive(self) -> str:
        """`<key>:1`, then `<key>:2`...: the n-th key asked for by this work, the same on each run
        of the same code."""
        derived = f"{self.key}:{next(self._counter)}"
        if len(derived) > MAX_LENGTH:  # a long key: its digest stands for it
            derived = f"sha256:{hashlib.sha256(self.key.encode()).hexdigest()}:{derived.rsplit(':', 1)[1]}"
        return derived


_current: ContextVar[KeyedWork | None] = ContextVar("idempotency_keyed_work", default=None)


@contextmanager
def keyed_work(scope: str, key: str, *, owner=None):
    """Run the block as this keyed work (current_work() answers it); nested blocks stack."""
    token = _current.set(KeyedWork(scope=scope, key=key, owner=owner))
    try:
        yield
    finally:
        _current.reset(token)


def current_work() -> KeyedWork | None:
    """The innermost keyed work being run in this context, or None."""
    return _current.get()
