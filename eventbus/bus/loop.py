"""One shape for the bus's long-running processes (rq's worker): the router, the reclaimer and
the sweeper implement only their unit of work; the loop around it is this one.

- SIGTERM or SIGINT sets the stop flag: the unit in hand finishes, then the loop ends; a second
  signal forces the exit (eventbus.bus.stopping). Waits between units end at once on a stop.
- A unit that fails is logged and tried again after a backoff that doubles up to a cap, with
  `setup()` run again first (groups re-created, pending entries re-read) and a broken database
  connection dropped: a failure never becomes a crash loop of the process.
- `burst` (tests, one-off runs): stop once a unit found nothing to do, or after one unit for
  the workers whose unit is a whole pass (`one_pass_burst`). A burst run gives up with the
  error after `burst_failures` failed units in a row, rather than retrying forever.
"""

from __future__ import annotations

import logging
import threading

from django.db import close_old_connections
from redis.exceptions import ConnectionError, TimeoutError

from eventbus.bus.stopping import GracefulStop

log = logging.getLogger("eventbus")

MIN_BACKOFF, MAX_BACKOFF = 0.1, 5.0


class LoopWorker:
    name = "worker"
    # Seconds to wait after each unit (0: the unit waits itself, e.g. a blocking read).
    pause: float = 0.0
    one_pass_burst = False
    burst_failures = 5

    def __init__(self, *, burst: bool = False):
        self.burst = burst
        self._stop = threading.Event()

    # What a subclass implements -----------------------------------------------------------

    def setup(self) -> None:
        """Before the first unit, and again after a failed one."""

    def work_once(self) -> int:
        """One unit of work; returns how much it did (0: nothing to do)."""
        raise NotImplementedError("LoopWorker subclasses must implement work_once()")

    def teardown(self) -> None:
        """After the last unit, however the loop ended."""

    # The loop -------------------------------------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Safe from a signal handler and from another thread."""
        self._stop.set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True when a stop was requested."""
        return self._stop.wait(seconds) if seconds > 0 else self.stop_requested

    def run(self) -> int:
        """Run units until stopped (or, with `burst`, until done); returns the work done."""
        if threading.current_thread() is threading.main_thread():
            with GracefulStop(self.request_stop, self.name):
                return self._loop()
        return self._loop()  # in a thread (tests): the caller stops it with request_stop()

    def _loop(self) -> int:
        total, backoff, failures, ready = 0, MIN_BACKOFF, 0, False
        try:
            while not self.stop_requested:
                try:
                    if not ready:
                        self.setup()
                        ready = True
                    done = self.work_once()
                except Exception as exc:
                    failures += 1
                    if self.burst and failures >= self.burst_failures:
                        raise
                    if isinstance(exc, (ConnectionError, TimeoutError)):
                        log.warning("%s: %s; retrying in %.1fs", self.name, exc, backoff)
                    else:
                        log.exception("%s: a unit of work failed; retrying in %.1fs", self.name, backoff)
                    ready = False
                    # A database connection the failure broke (a killed backend, a failover)
                    # would fail every unit after it: Django drops it only at a request's end.
                    close_old_connections()
                    self.wait(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF)
                    continue
                total += done
                backoff, failures = MIN_BACKOFF, 0
                if self.burst and (self.one_pass_burst or not done):
                    break
                self.wait(self.pause)
        finally:
            self.teardown()
        return total
