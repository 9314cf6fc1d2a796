"""The cyclic GC's full collections held off while every socket of the process resyncs.

A full (generation 2) collection walks every object the process holds: with 20,000 sockets
that is about a second with the event loop stopped. Once enough objects have survived since
the last one (sockets opened meanwhile), it runs at the next burst of allocations, and a
resync after a Redis blip, which sends every socket its missed frames at once, is one: it
landed inside the resync, and every socket's frames waited for it (p99 1.6 s against 0.5 s;
bench/REPORT-gateway.md). The young collections go on meanwhile, so short-lived cycles are
still freed; the full collection comes after the burst (the reads answered, and GRACE_SECONDS
more for the frames they and the blip's live events bring: released as the last read
answered, it ran at once, with most frames still to send). It is postponed, not saved: it then
pauses whatever live traffic there is. Not gc.freeze(): config.asgi freezes what the imports
made, and a gc.unfreeze() here would thaw that too, while a freeze never undone would keep the
cycles of every socket that closes afterwards.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterable

# Generation 2's threshold while held: never reached (it counts generation 1's collections).
HELD = 1_000_000_000
# A hold lasts that long after the reads it waits for are done.
GRACE_SECONDS = 1.0
# A hold ends by then whatever happens (a read that never settles must not end full collections).
LIMIT_SECONDS = 10.0

_holds = 0
_threshold: tuple[int, int, int] | None = None  # the thresholds before the first hold


def _hold() -> Callable[[], None]:
    """Hold full collections off; returns the release (idempotent). Holds nest."""
    global _holds, _threshold
    if _holds == 0:
        _threshold = gc.get_threshold()
        gc.set_threshold(_threshold[0], _threshold[1], HELD)
    _holds += 1
    released = False

    def release() -> None:
        global _holds, _threshold
        nonlocal released
        if released:
            return
        released = True
        _holds -= 1
        if _holds == 0 and _threshold is not None:
            # Left alone if someone else set thresholds meanwhile: theirs stand.
            if gc.get_threshold() == (_threshold[0], _threshold[1], HELD):
                gc.set_threshold(*_threshold)
            _threshold = None

    return release


def full_collections_held_until(futures: Iterable[asyncio.Future]) -> None:
    """Hold full collections off until GRACE_SECONDS after every one of `futures` is done,
    or LIMIT_SECONDS at most."""
    waiting = set(futures)
    if not waiting:
        return
    release = _hold()
    loop = asyncio.get_running_loop()
    timer = loop.call_later(LIMIT_SECONDS, release)
    remaining = len(waiting)

    def one_done(_: asyncio.Future) -> None:
        nonlocal remaining
        remaining -= 1
        if remaining == 0:
            timer.cancel()
            loop.call_later(GRACE_SECONDS, release)

    for future in waiting:
        future.add_done_callback(one_done)
