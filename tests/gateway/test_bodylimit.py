"""gateway.bodylimit: a request body over GATEWAY["MAX_BODY_SIZE"] is refused with a 413 problem
before it is read. The ASGI wrapper driven directly (the limit per path, a declared and a streamed
body), the WSGI middleware, then the demo's server process (uvicorn serving config.asgi) sent a
declared 1 GiB body and a chunked one over a real socket."""

import json
import select
import socket

import pytest
from django.test import RequestFactory

from gateway.bodylimit import RequestBodyLimit, RequestBodyLimitMiddleware, body_limit

MIB = 1024 * 1024


@pytest.fixture
def limits(settings):
    settings.GATEWAY = {
        **getattr(settings, "GATEWAY", {}),
        "MAX_BODY_SIZE": 100,
        "MAX_BODY_SIZE_BY_PATH": {"/uploads/": 1000, "/uploads/free/": None},
    }


def test_the_longest_matching_prefix_sets_the_limit(limits):
    assert body_limit("/api/jobs/") == 100
    assert body_limit("/uploads/a") == 1000
    assert body_limit("/uploads/free/a") is None


def test_the_default_is_ten_mib():
    assert body_limit("/api/jobs/") == 10 * MIB


class App:
    """An ASGI app that reads the whole body, as Django's handler does, then answers 200."""

    def __init__(self):
        self.called = False
        self.body = b""
        self.saw_disconnect = False

    async def __call__(self, scope, receive, send):
        self.called = True
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.saw_disconnect = True
                return
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(path, chunks, headers=()):
    """Run RequestBodyLimit(App()) on a request whose body comes in `chunks`: (app, sent messages,
    how many chunks the server was asked for)."""
    app, sent, asked = App(), [], 0
    chunks = list(chunks)

    async def receive():
        nonlocal asked
        asked += 1
        body = chunks[asked - 1]
        return {"type": "http.request", "body": body, "more_body": asked < len(chunks)}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "method": "POST", "headers": list(headers)}
    await RequestBodyLimit(app)(scope, receive, send)
    return app, sent, asked


def assert_413(sent, limit):
    start, body = sent
    assert start["status"] == 413
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"application/problem+json"
    assert headers[b"connection"] == b"close"
    problem = json.loads(body["body"])
    assert problem["status"] == 413 and problem["title"] == "Content Too Large"
    assert problem["max_body_size"] == limit and str(limit) in problem["detail"]


async def test_a_declared_body_over_the_limit_is_refused_unread(limits):
    app, sent, asked = await call("/api/jobs/", [b"x" * 101], [(b"content-length", b"101")])
    assert not app.called and asked == 0
    assert_413(sent, 100)


async def test_a_streamed_body_is_refused_once_it_passes_the_limit(limits):
    app, sent, asked = await call("/api/jobs/", [b"x" * 60] * 10)
    assert app.saw_disconnect and asked == 2  # 120 bytes read of 600: no more
    assert_413(sent, 100)


async def test_bodies_within_their_paths_limit_pass(limits):
    app, sent, _ = await call("/api/jobs/", [b"x" * 50] * 2, [(b"content-length", b"100")])
    assert app.body == b"x" * 100 and sent[0]["status"] == 200
    app, sent, _ = await call("/uploads/a", [b"x" * 500] * 2)
    assert len(app.body) == 1000 and sent[0]["status"] == 200
    app, sent, _ = await call("/uploads/free/a", [b"x" * 5000] * 2, [(b"content-length", b"10000")])
    assert len(app.body) == 10000 and sent[0]["status"] == 200


async def test_other_scopes_pass_untouched(limits):
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    await RequestBodyLimit(app)({"type": "lifespan"}, None, None)
    assert seen == ["lifespan"]


def test_the_wsgi_middleware_refuses_a_declared_body_over_the_limit(limits):
    middleware = RequestBodyLimitMiddleware(lambda request: pytest.fail("the view ran"))
    request = RequestFactory().post("/api/jobs/", data=b"x" * 101, content_type="application/json")
    response = middleware(request)
    assert response.status_code == 413 and response["Content-Type"] == "application/problem+json"
    assert json.loads(response.content)["max_body_size"] == 100
    passed = RequestBodyLimitMiddleware(lambda request: "the view's")
    upload = RequestFactory().post("/uploads/a", data=b"x" * 101, content_type="application/json")
    assert passed(upload) == "the view's"


# The demo's server process: uvicorn serving config.asgi as the Procfile runs it.


def send_body(port, head: bytes, pieces, total: int):
    """Send the head, then body pieces until the server answers (or drops the connection), up to
    `total` bytes; then read the answer to the end. (response bytes, body bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sent = 0
    try:
        sock.sendall(head)
        while sent < total:
            if select.select([sock], [], [], 0)[0]:
                break  # the server answered: it reads no more
            try:
                piece = pieces(sent)
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        response = b""
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break  # the server closed the connection
            response += data
        return response, sent
    finally:
        sock.close()


def port_of(web) -> int:
    return int(web.url.rsplit(":", 1)[1])


def assert_413_response(response: bytes):
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), response[:300]
    assert b"content-type: application/problem+json" in head.lower()
    assert json.loads(body)["max_body_size"] == 10 * MIB


@pytest.mark.processes
def test_the_server_refuses_a_declared_gigabyte_at_once(web):
    total = 1024 * MIB
    head = (
        f"POST /api/jobs/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {total}\r\n\r\n"
    ).encode()
    piece = b"x" * MIB
    response, sent = send_body(port_of(web), head, lambda sent: piece, total)
    assert_413_response(response)
    assert sent < 64 * MIB  # the connection ended long before the gigabyte was through


@pytest.mark.processes
def test_the_server_refuses_a_chunked_body_once_past_the_limit(web):
    total = 1024 * MIB
    head = (
        b"POST /api/jobs/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    data = b"x" * (256 * 1024)
    chunk = f"{len(data):x}\r\n".encode() + data + b"\r\n"
    response, sent = send_body(port_of(web), head, lambda sent: chunk, total)
    assert_413_response(response)
    assert sent < 64 * MIB  # read to just past 10 MiB, then the connection ended
