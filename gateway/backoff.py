"""How the gateway waits for Redis or the database to answer again: one backoff for every
retry (the hub's subscribe and read loops, a socket's history and database reads), from
GATEWAY['RECONNECT_DELAY'], doubling up to MAX_DELAY."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .conf import gateway_settings

MAX_DELAY = 2.0
T = TypeVar("T")


class Backoff:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.delay = gateway_settings.RECONNECT_DELAY

    async def wait(self) -> None:
        delay, self.delay = self.delay, min(self.delay * 2, MAX_DELAY)
        await asyncio.sleep(delay)


async def retrying(
    call: Callable[[], Awaitable[T]],
    errors: tuple[type[BaseException], ...],
    what: str,
    logger: logging.Logger,
    *,
    stop: Callable[[], bool] = lambda: False,
) -> T | None:
    """`await call()` until it returns (its value) or `stop()` (None): the errors given mean
    the server is away for now, and are logged as `what` with the wait before the next try."""
    backoff = Backoff()
    while not stop():
        try:
            return await call()
        except errors as exc:
            logger.warning("%s (%s); retrying in %.2f s", what, exc, backoff.delay)
            await backoff.wait()
    return None
