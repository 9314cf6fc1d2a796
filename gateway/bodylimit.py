"""A cap on request bodies, applied before anything reads them: `RequestBodyLimit(app)` wraps an
ASGI application (the "http" of your ProtocolTypeRouter), `RequestBodyLimitMiddleware` is the same
check for a WSGI deployment.

Django's ASGI handler reads a request's whole body (spooled to a temporary file past
FILE_UPLOAD_MAX_MEMORY_SIZE) before it builds the request, so neither DATA_UPLOAD_MAX_MEMORY_SIZE
nor a view can stop an anonymous 300 MB POST from being read to its end. This wrapper answers
413 (application/problem+json) as soon as the body is known to be over the limit: at once when its
Content-Length says so, or, for a body sent without one (chunked), once the part read goes past
it; the application then sees the client gone (`http.disconnect`), and the rest is never read. The
response says `Connection: close`, so that the server drops the connection instead of reading the
remainder to reuse it.

The limit is GATEWAY["MAX_BODY_SIZE"], and GATEWAY["MAX_BODY_SIZE_BY_PATH"] raises (or lowers)
it under path prefixes (the longest matching prefix wins; None there: no limit), for the upload
views of a project.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse

from idempotency.problems import CONTENT_TYPE, problem, problem_body

from .conf import gateway_settings

TITLE = "Content Too Large"  # RFC 9110's name for 413


def body_limit(path: str) -> int | None:
    """The most bytes a request body to `path` may have (None: no limit)."""
    limit = gateway_settings.MAX_BODY_SIZE
    matched = ""
    for prefix, prefix_limit in (gateway_settings.MAX_BODY_SIZE_BY_PATH or {}).items():
        if path.startswith(prefix) and len(prefix) > len(matched):
            matched, limit = prefix, prefix_limit
    return limit


def too_large_detail(limit: int) -> str:
    return f"The request body is over this server's limit of {limit} bytes for this path."


def declared_length(headers) -> int | None:
    """The Content-Length of an ASGI scope's headers, or None (none, several, or not a number:
    the server refuses those itself, or the application does)."""
    values = [value for name, value in headers if name == b"content-length"]
    if len(values) != 1 or not values[0].strip().isdigit():
        return None
    return int(values[0])


async def send_too_large(send, limit: int) -> None:
    body = json.dumps(problem_body(413, too_large_detail(limit), title=TITLE, max_body_size=limit)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", CONTENT_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),  # the rest of the body is not read: the connection ends
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _CountedReceive:
    """The server's receive, counting the body's bytes: past the limit the application gets
    `http.disconnect` (and every call after), and nothing more is read from the server."""

    def __init__(self, receive, limit: int):
        self.server_receive = receive
        self.limit = limit
        self.read = 0
        self.exceeded = False

    async def __call__(self) -> dict[str, Any]:
        if self.exceeded:
            return {"type": "http.disconnect"}
        message = await self.server_receive()
        if message["type"] == "http.request":
            self.read += len(message.get("body", b""))
            if self.read > self.limit:
                self.exceeded = True
                return {"type": "http.disconnect"}
        return message


class RequestBodyLimit:
    """ASGI middleware: a request body over the path's limit is answered 413 before it is read.

    Parameters
    ----------
    app : ASGI application
        The "http" application it wraps.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = body_limit(scope.get("path", ""))
        if limit is None:
            return await self.app(scope, receive, send)
        declared = declared_length(scope.get("headers", ()))
        if declared is not None and declared > limit:
            await send_too_large(send, limit)
            return
        counted = _CountedReceive(receive, limit)
        started = False

        async def guarded_send(message):
            nonlocal started
            if counted.exceeded and not started:
                return  # the application answers a client it thinks gone: the 413 goes instead
            started = True
            await send(message)

        await self.app(scope, counted, guarded_send)
        if counted.exceeded and not started:
            await send_too_large(send, limit)


class RequestBodyLimitMiddleware:
    """Django middleware for WSGI: a request whose Content-Length is over the path's limit is
    answered 413 before anything reads its body. (Under ASGI the body is read before any
    middleware runs: wrap the application in RequestBodyLimit instead.)

    Parameters
    ----------
    get_response : callable
        The next middleware or the view.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = body_limit(request.path_info)
        length = request.META.get("CONTENT_LENGTH") or ""
        if limit is not None and length.strip().isdigit() and int(length) > limit:
            response = problem(413, too_large_detail(limit), title=TITLE, max_body_size=limit)
            response["Connection"] = "close"
            return response
        return self.get_response(request)
