"""A minimal WebSocket client for the gateway bench's held sockets (bench/gateway.py).

Tens of thousands of sockets share this process's CPU with the server under test: with the
`websockets` library (a task, a parser generator and a frame queue per socket) the clients took
about 100 us per frame, so a fan-out to 5,000 sockets ended after ~500 ms however fast the server
was. This one is an `asyncio.Protocol` per socket and nothing else: the handshake written by
hand, the server's frames parsed from the bytes as they come (the server never masks them), pings
answered, a close answered; a frame is handed to the probe waiting for it, if any, or dropped. No
task, no timer, no JSON.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
import zlib

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


class HandshakeFailed(Exception):
    pass


class Probe:
    """Waits for the first frame holding `marker` on each of its sockets: their arrival times."""

    def __init__(self, marker: bytes, sockets: list[LightSocket]):
        self.marker = marker
        self.arrived_ns: list[int] = []
        self.expected = len(sockets)
        self.done = asyncio.get_running_loop().create_future()
        for sock in sockets:
            sock.probe = self
        if not sockets:
            self.done.set_result(None)

    def check(self, sock: LightSocket, payload: bytes) -> None:
        if self.marker in payload and payload.startswith(b'{"type":"event"'):
            self.arrived_ns.append(time.time_ns())
            sock.probe = None
            if len(self.arrived_ns) == self.expected and not self.done.done():
                self.done.set_result(None)

    def cancel(self, sockets: list[LightSocket]) -> None:
        for sock in sockets:
            if sock.probe is self:
                sock.probe = None


class LightSocket(asyncio.Protocol):
    __slots__ = (
        "buffer",
        "close_code",
        "closed",
        "closing",
        "fragments",
        "frames",
        "inflater",
        "is_open",
        "opened",
        "probe",
        "request",
        "transport",
    )

    def __init__(self, request: bytes):
        loop = asyncio.get_running_loop()
        self.request = request
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.opened: asyncio.Future = loop.create_future()
        self.closed: asyncio.Future = loop.create_future()
        self.is_open = self.closing = False
        self.close_code: int | None = None
        self.inflater: zlib._Decompress | None = None  # permessage-deflate, when the server took it
        self.fragments: bytearray | None = None
        self.frames = 0
        self.probe: Probe | None = None

    # asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.request)
        self.request = b""

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        if not self.is_open and not self.closing:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end])
            del buf[: end + 4]
            status = head.split(b"\r\n", 1)[0]
            if not status.startswith(b"HTTP/1.1 101"):
                if not self.opened.done():
                    self.opened.set_exception(HandshakeFailed(status.decode(errors="replace")))
                self.transport.close()  # type: ignore[union-attr]
                return
            if b"permessage-deflate" in head.lower():
                self.inflater = zlib.decompressobj(-15)
            self.is_open = True
            self.opened.set_result(None)
        self._parse()

    def connection_lost(self, exc) -> None:
        self.is_open = False
        if self.close_code is None:
            self.close_code = 1006
        if not self.opened.done():
            self.opened.set_exception(HandshakeFailed(f"connection lost: {exc!r}"))
        if not self.closed.done():
            self.closed.set_result(None)

    # frames

    def _parse(self) -> None:
        buf = self.buffer
        while len(buf) >= 2:
            b0, length = buf[0], buf[1] & 0x7F
            start = 2
            if length == 126:
                if len(buf) < 4:
                    return
                length, start = int.from_bytes(buf[2:4], "big"), 4
            elif length == 127:
                if len(buf) < 10:
                    return
                length, start = int.from_bytes(buf[2:10], "big"), 10
            end = start + length
            if len(buf) < end:
                return
            payload = bytes(buf[start:end])
            del buf[:end]
            opcode = b0 & 0x0F
            if opcode in (TEXT, BINARY, CONTINUATION):
                self._data(b0, payload)
            elif opcode == PING:
                self._send(PONG, payload)
            elif opcode == CLOSE:
                self.close_code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                if not self.closing:  # the server's close: answered, then it closes the TCP connection
                    self.closing = True
                    self._send(CLOSE, payload[:2])
                self.is_open = False

    def _data(self, b0: int, payload: bytes) -> None:
        if not b0 & 0x80:  # not the last fragment
            self.fragments = (self.fragments or bytearray()) + payload
            return
        if self.fragments is not None:
            payload, self.fragments = bytes(self.fragments) + payload, None
        if b0 & 0x40 and self.inflater is not None:  # RSV1: compressed
            payload = self.inflater.decompress(payload + b"\x00\x00\xff\xff")
        self.frames += 1
        probe = self.probe
        if probe is not None:
            probe.check(self, payload)

    def _send(self, opcode: int, payload: bytes) -> None:
        """A client's frame (masked), payload < 126 bytes: control frames only."""
        if self.transport is None or self.transport.is_closing():
            return
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.transport.write(bytes((0x80 | opcode, 0x80 | len(payload))) + mask + masked)

    async def close(self, timeout: float = 10) -> None:
        if self.is_open and not self.closing:
            self.closing = True
            self._send(CLOSE, (1000).to_bytes(2, "big"))
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), timeout)
        except TimeoutError:
            if self.transport is not None:
                self.transport.abort()


def request(host: str, port: int, path: str, headers: dict[str, str], deflate: bool) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    if deflate:  # as browsers offer it
        lines.append("Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def connect(
    host: str,
    port: int,
    path: str,
    headers: dict[str, str],
    *,
    deflate: bool = False,
    source: str | None = None,
    timeout: float = 60,
) -> LightSocket:
    """An open socket (its handshake done), from `source` (a local address) if given."""
    loop = asyncio.get_running_loop()
    raw = request(host, port, path, headers, deflate)
    transport, sock = await loop.create_connection(
        lambda: LightSocket(raw), host, port, local_addr=(source, 0) if source else None
    )
    try:
        await asyncio.wait_for(asyncio.shield(sock.opened), timeout)
    except BaseException:
        transport.abort()
        raise
    return sock
