"""A TCP proxy that the chaos harness puts between the Celery workers and Redis, to stall the
network and to drop it: `stall(seconds)` holds every byte in both directions for that long
(connections stay open, as behind a congested or partitioned link), `drop()` cuts every
connection at once (a TCP reset, as when a link or a NAT entry dies)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time


class StallingProxy:
    def __init__(self, upstream_port: int, *, host: str = "127.0.0.1"):
        self.host = host
        self.upstream_port = upstream_port
        self.port = 0
        self.connections = 0  # accepted since the start
        self.dropped = 0  # cut by drop()
        self._loop = asyncio.new_event_loop()
        self._open: set[asyncio.StreamWriter] = set()
        self._flowing: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> StallingProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            client_writer.transport.abort()  # Redis is down: so is the way to it
            return
        self.connections += 1
        self._open.update((client_writer, upstream_writer))
        try:
            await asyncio.gather(
                self._pump(client_reader, upstream_writer), self._pump(upstream_reader, client_writer)
            )
        finally:
            for writer in (client_writer, upstream_writer):
                self._open.discard(writer)
                writer.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                await self._flowing.wait()  # a stall holds the bytes here
                writer.write(data)
                await writer.drain()
        writer.transport.abort()  # one side closed: the other goes too

    def stall(self, seconds: float) -> None:
        """Hold all traffic for `seconds` (blocking), then let it through."""
        assert self._flowing is not None
        self._loop.call_soon_threadsafe(self._flowing.clear)
        time.sleep(seconds)
        self._loop.call_soon_threadsafe(self._flowing.set)

    def drop(self) -> int:
        """Reset every open connection; how many client connections were cut."""

        async def cut() -> int:
            writers = list(self._open)
            for writer in writers:
                sock = writer.get_extra_info("socket")
                if sock is not None:  # RST, not FIN: the peer sees the connection die
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
            self._open.clear()
            return len(writers) // 2

        count = asyncio.run_coroutine_threadsafe(cut(), self._loop).result(10)
        self.dropped += count
        return count

    def stop(self) -> None:
        async def close() -> None:
            self._server.close()
            for writer in list(self._open):
                writer.transport.abort()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
