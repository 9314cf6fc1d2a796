"""A Redis connection each thread keeps for the bus's own round trips (eventbus.scripts).

redis-py's pool checks a connection out and back in around every command: a pid check (a
system call), a lock, a readiness poll (another) and its metrics, as much Python as all the
rest of a single publish. A thread that runs scripts keeps the connection it took instead:

- it goes back to its pool when the thread ends (or the thread moves to another client: new
  settings, another node of a cluster), so a thread per request leaks nothing;
- used again after more than IDLE_CHECK seconds, it is first checked the way the pool checks
  (data or EOF waiting: the server closed it, or a reply was left unread) and reconnected;
- a child process forgets its parent's (the socket is the parent's);
- the caller drops it on any error (`drop`): a reply may be left unread.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

IDLE_CHECK = 1.0


class _Slot:
    """One thread's connection; handed back to its pool when the thread's slot goes."""

    __slots__ = ("pool", "connection", "used", "__weakref__")

    def __init__(self, pool, connection):
        self.pool, self.connection, self.used = pool, connection, time.monotonic()
        weakref.finalize(self, _release, pool, connection)


def _release(pool, connection) -> None:
    try:
        pool.release(connection)
    except Exception:  # pragma: no cover - a pool closed meanwhile: nothing to give back
        pass


_local = threading.local()


def _forget_after_fork() -> None:
    global _local
    _local = threading.local()  # not released: the parent still uses those connections


os.register_at_fork(after_in_child=_forget_after_fork)


def connection_of(pool):
    """This thread's connection of `pool`, connected and ready to send."""
    slot = getattr(_local, "slot", None)
    if slot is not None and slot.pool is pool:
        now = time.monotonic()
        connection = slot.connection
        if now - slot.used > IDLE_CHECK:
            try:
                if connection.can_read():
                    connection.disconnect()
            except Exception:  # redis' ConnectionError, an OSError...: a new connection will tell
                connection.disconnect()
        slot.used = now
        return connection
    _local.slot = None  # gives the previous one back to its pool
    connection = pool.get_connection()
    _local.slot = _Slot(pool, connection)
    return connection


def drop() -> None:
    """After an error mid round trip: close this thread's connection (it reconnects when used)."""
    slot = getattr(_local, "slot", None)
    if slot is not None:
        slot.connection.disconnect()
