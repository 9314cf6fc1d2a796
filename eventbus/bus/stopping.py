"""Clean stops for the long-running commands, after rq's worker: the first SIGTERM or SIGINT
asks the loop to stop once the batch in hand is settled; a second one forces the exit (entries
in hand stay pending and the reclaimer re-delivers them)."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

log = logging.getLogger("eventbus")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GracefulStop:
    def __init__(self, request_stop: Callable[[], None], name: str = "eventbus"):
        self.request_stop = request_stop
        self.name = name
        self.requested = False
        self._previous: dict = {}

    def __enter__(self) -> GracefulStop:
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested:
            log.warning("%s: second %s, forced stop; entries in hand stay pending", self.name, name)
            raise SystemExit(1)
        self.requested = True
        log.info("%s: %s, stopping after the batch in hand (again to force)", self.name, name)
        self.request_stop()
