"""Real threads released together, for the race tests: each runs `fn(i)` on a database
connection of its own, closed when it is done."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections, connection


def in_threads(n, fn):
    """`fn(0)` ... `fn(n - 1)` on n threads that start at once (a barrier); their results in order."""
    barrier = threading.Barrier(n)

    def run(i):
        try:
            barrier.wait()
            return fn(i)
        finally:
            close_old_connections()
            connection.close()

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))
