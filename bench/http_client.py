"""The benchmarks' HTTP/1.1 client side: one response read from a keep-alive connection.
bench/idempotency.py and bench/jobs.py send raw requests over asyncio streams with it (not named
http.py: a benchmark runs with bench/ first on sys.path, where it would hide the standard http)."""

from __future__ import annotations

import asyncio


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict, bytes]:
    """(status, headers with lower-case names, body) of the next response (Content-Length framed)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return status, headers, await reader.readexactly(int(headers.get("content-length", "0")))
