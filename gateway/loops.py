"""One object per running event loop: the gateway's process-wide services (the Redis hub, the
session watch) belong to the loop that serves the sockets (one per process under daphne or
uvicorn; one per test under pytest-asyncio, so that no test inherits another's connections)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """`get()` makes the running loop's object on first use; `close()` drops it and awaits
    `closer(obj)` (tests; otherwise it lives as long as its loop)."""

    def __init__(self, factory: Callable[[], T], closer: Callable[[T], Awaitable[object]]):
        self._factory, self._closer = factory, closer
        self._objects: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        found = self._objects.get(loop)
        if found is None:
            found = self._objects[loop] = self._factory()
        return found

    async def close(self) -> None:
        found = self._objects.pop(asyncio.get_running_loop(), None)
        if found is not None:
            await self._closer(found)
