"""uvicorn's internals the gateway uses, behind one version check asked once, at import, with
fallbacks written against uvicorn's public API and the ASGI spec (docs/design/adapters.md:
`exactly_once.internals`; EXACTLY_ONCE_INTERNALS=off forces the fallbacks). uvicorn is
optional (the distribution's `uvicorn` extra): without it the gateway runs under daphne and
nothing here imports uvicorn; with it, uvicorn's protocol is imported only when gateway.uvicorn
asks for it (a process running daphne does not).

Tested: uvicorn 0.44 to 0.54 (the gate: >= 0.44, < 0.55). 0.35 is the first release with the
websockets-sansio protocol (0.35.0: "Add WebSocketsSansIOProtocol", #2540), 0.36 the first whose
`--ws` takes an import path such as `gateway.uvicorn:WebSocketProtocol` (0.35 takes its own names
only), and 0.44 the first whose protocol calls `start_keepalive()` once the handshake's response
is sent, which the subclass below needs: older releases take the fallback.

- `websocket_protocol()`: the class `--ws gateway.uvicorn:WebSocketProtocol` names. The internal:
  uvicorn's websockets-sansio protocol
  (`uvicorn.protocols.websockets.websockets_sansio_impl.WebSocketsSansIOProtocol`), subclassed
  where it keeps more than an open socket needs, all of it set up in its `__init__` and its
  handshake (uvicorn has no option for these):
  - the handshake's request and response (their headers), which it reads no more once the
    response is sent: let go then (the scope's copy of the headers stays: the app may read it);
  - its receive queue, an `asyncio.Queue` (three deques and an Event with a fourth: 2.4 KB for the
    two or three messages a job stream's socket ever gets): a list, and a future while the app
    waits (`Inbox`);
  - its "writable" `asyncio.Event` (a deque of waiters each): the same with a list (`Gate`).
  About 9 KB of Python objects per socket: RSS per socket at 10,000 sockets 24.3 -> 18.4 KiB (the
  queue, the request and the response), then 18.8 -> 15.3 KiB (the request's headers), fan-out CPU
  the same (bench/REPORT-gateway.md, change 9). Fallback: uvicorn's own protocol, as its
  `--ws websockets-sansio` names it, or as `--ws websockets` does in a release without that one:
  the same streams, with those 9 KB more a socket.
- `http_protocol()`: the class `--http gateway.uvicorn:HTTPProtocol` names. The internal: uvicorn's
  h11 protocol (`uvicorn.protocols.http.h11_impl.H11Protocol`), which waits without end for a
  request's head (its `--timeout-keep-alive` runs only between requests, and stops at the first
  byte): subclassed to close a connection whose request head is not in, whole, within
  `--timeout-keep-alive` seconds of the connection or of its first byte (a connection that sends
  nothing, or a head a byte at a time). Fallback: uvicorn's own protocol as its `--http auto`
  names it, which holds such connections until the client goes (the proxy in front must close them).
- `CLIENT_GONE` and `reporting_gone(send)`: what a send to a client that just left raises (the
  consumer stops sending, nothing failed). The internal: `uvicorn.protocols.utils.ClientDisconnected`,
  the error uvicorn raises then; `reporting_gone` is the send as given. Fallback: what the ASGI spec
  promises (2.4: a send on a closed connection raises a server-specific subclass of OSError),
  narrowed to the send: `reporting_gone(send)` turns an OSError its send raises into `ClientLeft`,
  so that one from anything else (a Redis read during a socket's catch-up) is not taken for the
  client leaving. It costs one coroutine more per frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from exactly_once.internals import installed, internals

INTERNALS = internals("gateway.adapters.uvicorn_protocols", "uvicorn", "0.44", "0.55")

Send = Callable[[dict[str, Any]], Awaitable[None]]


class ClientLeft(Exception):
    """The server's send raised an OSError: by the ASGI spec, the client is gone."""


if INTERNALS:
    from uvicorn.protocols.utils import ClientDisconnected

    CLIENT_GONE: tuple[type[BaseException], ...] = (ClientDisconnected,)

    def reporting_gone(send: Send) -> Send:
        """The send as given: uvicorn's raises ClientDisconnected once the client is gone."""
        return send

elif installed("uvicorn") is not None:
    CLIENT_GONE = (ClientLeft,)

    def reporting_gone(send: Send) -> Send:
        """The send, raising ClientLeft where the server's raises an OSError."""

        async def send_or_report(message: dict[str, Any]) -> None:
            try:
                await send(message)
            except OSError as exc:
                raise ClientLeft(str(exc)) from exc

        return send_or_report

else:  # no uvicorn: the gateway runs under another server
    CLIENT_GONE = ()

    def reporting_gone(send: Send) -> Send:
        """The send as given."""
        return send


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


@functools.cache
def lean_protocol() -> type[asyncio.Protocol]:
    """uvicorn's websockets-sansio protocol keeping less per socket (made on first use: a process
    that runs daphne never imports uvicorn's protocol)."""
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

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

    WebSocketProtocol.__qualname__ = "WebSocketProtocol"
    return WebSocketProtocol


@functools.cache
def head_timeout_protocol() -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a deadline for each request's head (made on first use)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HTTPProtocol(H11Protocol):
        head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._await_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
                self._head_in()  # a request is in (or the connection ends): its head came whole
            elif self.head_timer is None:
                self._await_head()  # the first bytes of a next request's head: from now on

        def handle_websocket_upgrade(self, event: h11.Request) -> None:
            self._head_in()
            super().handle_websocket_upgrade(event)

        def connection_lost(self, exc: Exception | None) -> None:
            self._head_in()
            super().connection_lost(exc)

        def _await_head(self) -> None:
            self.head_timer = self.loop.call_later(self.timeout_keep_alive, self._head_late)

        def _head_in(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def _head_late(self) -> None:
            self.head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    HTTPProtocol.__qualname__ = "HTTPProtocol"
    return HTTPProtocol


def public_http_protocol() -> type[asyncio.Protocol]:
    """uvicorn's own HTTP protocol, as its `--http auto` names it."""
    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.importer import import_from_string

    return import_from_string(HTTP_PROTOCOLS["auto"])


http_protocol = head_timeout_protocol if INTERNALS else public_http_protocol


def public_protocol() -> type[asyncio.Protocol]:
    """uvicorn's own WebSocket protocol, by the names of its `--ws` option: "websockets-sansio"
    where the release has it and it imports, else "websockets"."""
    from uvicorn.config import WS_PROTOCOLS
    from uvicorn.importer import ImportFromStringError, import_from_string

    sansio = WS_PROTOCOLS.get("websockets-sansio")
    if sansio:
        try:
            return import_from_string(sansio)
        except (ImportError, ImportFromStringError):
            pass
    return import_from_string(WS_PROTOCOLS["websockets"])


websocket_protocol = lean_protocol if INTERNALS else public_protocol
