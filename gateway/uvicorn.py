"""uvicorn's WebSocket protocol (websockets-sansio) with less kept per socket, for a gateway that
holds thousands: `uvicorn ... --ws gateway.uvicorn:WebSocketProtocol`.

The same protocol, subclassed where it keeps more than an open socket needs, all of it set up in
its `__init__` and its handshake (uvicorn has no option for these):
- the handshake's request and response (their headers), which it reads no more once the response
  is sent: let go then (the scope's copy of the headers stays: the app may read it);
- its receive queue, an `asyncio.Queue` (three deques and an Event with a fourth: 2.4 KB for the
  two or three messages a job stream's socket ever gets): a list, and a future while the app waits;
- its "writable" `asyncio.Event` (a deque of waiters each): the same with a list.
About 9 KB of Python objects per socket (bench/REPORT-gateway.md). Everything else is uvicorn's:
written against uvicorn 0.54 (requirements.txt); tests/gateway/test_uvicorn.py runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class _Waiters:
    """The futures of the coroutines waiting on an Inbox or a Gate; the list made when one first
    waits (most sockets never do)."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future] | None = None

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[asyncio.Future]:
        """A future to await, listed for the wakers while the block runs."""
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        waiters = self._waiters
        waiters.append(waiter)
        try:
            yield waiter
        finally:
            waiters.remove(waiter)


class Inbox(_Waiters):
    """What uvicorn's protocol uses of its asyncio.Queue: put_nowait(), get(), empty()."""

    __slots__ = ("_messages",)

    def __init__(self) -> None:
        super().__init__()
        self._messages: list = []

    def put_nowait(self, message: Any) -> None:
        self._messages.append(message)
        self._wake_one()

    async def get(self) -> Any:
        while not self._messages:
            with self._waiting() as waiter:
                try:
                    await waiter
                except asyncio.CancelledError:
                    if waiter.done() and not waiter.cancelled():
                        self._wake_one()  # it was woken for a message it will not take: the next one
                    raise
        return self._messages.pop(0)

    def empty(self) -> bool:
        return not self._messages

    def qsize(self) -> int:
        return len(self._messages)

    def _wake_one(self) -> None:
        for waiter in self._waiters or ():
            if not waiter.done():
                waiter.set_result(None)
                return


class Gate(_Waiters):
    """What uvicorn's protocol uses of its asyncio.Event "writable": set(), clear(), is_set(), wait()."""

    __slots__ = ("_open",)

    def __init__(self) -> None:
        super().__init__()
        self._open = True

    def is_set(self) -> bool:
        return self._open

    def set(self) -> None:
        self._open = True
        for waiter in self._waiters or ():
            if not waiter.done():
                waiter.set_result(True)

    def clear(self) -> None:
        self._open = False

    async def wait(self) -> bool:
        if self._open:
            return True
        with self._waiting() as waiter:
            await waiter
            return True


class WebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = Inbox()  # type: ignore[assignment]
        self.writable = Gate()  # type: ignore[assignment]

    def start_keepalive(self) -> None:
        # Called once, right after the handshake's response went out (send(), websocket.accept):
        # uvicorn reads neither the request nor the response again. websockets' parser keeps the
        # request as long as the socket (a local of its generator) but reads it no more: emptied.
        self.request.headers.clear()
        self.request = self.response = None  # type: ignore[assignment]
        super().start_keepalive()
