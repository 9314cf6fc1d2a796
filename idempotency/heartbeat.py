"""Lease renewal while a request runs, so that only a dead request loses its key.

A lease that lasts a fixed time would let a retry take over a live request that is merely
slow, and run the work a second time. Instead, one daemon thread per process renews every
lease held in the process at a third of its length; a request that dies (its process killed)
stops being renewed and its lease expires, to be taken over by a retry.

Renewal is a compare-and-set on the lease token in its own database connection. A request
never waits for it: a renewal that lands after the request completed or released its key
finds no PENDING record with its token and changes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import connections

from .conf import idempotency_settings
from .stores.base import BaseStore, Lease

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Held:
    store: BaseStore
    lease: Lease
    seconds: int
    due: float


class LeaseKeeper:
    # The clock, swappable in tests.
    clock = staticmethod(time.monotonic)

    def __init__(self):
        self._changed = threading.Condition()
        self._held: dict[str, _Held] = {}
        self._thread: threading.Thread | None = None

    @contextmanager
    def hold(self, store: BaseStore, lease: Lease, seconds: int):
        """Renew `lease` every `seconds` / 3 while the block runs."""
        if not idempotency_settings.HEARTBEAT:
            yield
            return
        with self._changed:
            self._held[lease.token] = _Held(store, lease, seconds, self.clock() + seconds / 3)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="idempotency-lease-keeper", daemon=True
                )
                self._thread.start()
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._held.pop(lease.token, None)

    def held(self) -> int:
        with self._changed:
            return len(self._held)

    def _run(self) -> None:
        while True:
            with self._changed:
                due = self._wait_for_due()
            for token, held in due:
                alive = self._renew(held)
                with self._changed:
                    if token in self._held:
                        if alive:
                            held.due = self.clock() + held.seconds / 3
                        else:  # taken over meanwhile: the request finds out when it completes
                            del self._held[token]

    def _wait_for_due(self) -> list[tuple[str, _Held]]:
        while True:
            now = self.clock()
            due = [(token, held) for token, held in self._held.items() if held.due <= now]
            if due:
                return due
            if not self._held:
                # Idle: give the database connection back rather than hold it while waiting.
                connections.close_all()
            timeout = min((held.due for held in self._held.values()), default=now + 60) - now
            self._changed.wait(timeout)

    @staticmethod
    def _renew(held: _Held) -> bool:
        try:
            return held.store.renew(held.lease, held.seconds)
        except Exception:
            # The database is away: keep trying; the lease is only lost if it stays away.
            logger.warning(
                "idempotency lease of %s %s not renewed", held.lease.scope, held.lease.key, exc_info=True
            )
            connections.close_all()
            return True


keeper = LeaseKeeper()
