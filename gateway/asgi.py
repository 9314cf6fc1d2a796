"""The job stream's WebSocket entry: put `JobStreamApplication()` in the "websocket" slot of
your ProtocolTypeRouter.

It does in one layer what `AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(
websocket_urlpatterns)))` does for the job stream, with the same checks: the Origin against
ALLOWED_HOSTS (channels' own validator), the user of the session cookie (SESSION_ENGINE, and
Django's `get_user`: backend, user id and session hash), the route. channels' stack keeps, for as
long as each socket is open, a copy of the scope per layer (five), each layer's coroutine, the
session and the user: several KiB a socket, for thousands of sockets (bench/REPORT-gateway.md).
Here the consumer gets a scope of its own holding only what it reads (no headers, no session),
and it lets go of the user once it has authorized the socket.

A handshake with a bad Origin or a path that is no job stream is refused (HTTP 403, as channels'
WebsocketDenier does); a socket without a logged-in user is accepted and closed with 4401 by the
consumer, so that the client learns why. The consumer keeps the session's key (a short string):
the socket is closed with 4401 once the session ends (gateway.sessions).
"""

from __future__ import annotations

from importlib import import_module
from urllib.parse import urlparse

from channels.db import database_sync_to_async
from channels.security.websocket import AllowedHostsOriginValidator
from django.conf import settings
from django.contrib.auth import get_user
from django.http import HttpRequest
from django.http.cookie import parse_cookie

from .adapters.channels import Routes, connection_app
from .routing import websocket_urlpatterns


@database_sync_to_async
def session_user(session_key: str | None):
    """The user of the session (AnonymousUser if none), as django.contrib.auth's middleware finds
    it for a request: the session's user id and backend, and its auth hash checked (a session of
    a user whose password changed since is flushed)."""
    request = HttpRequest()  # get_user reads its session only
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    return get_user(request)


class JobStreamApplication:
    """An ASGI application for the job stream's sockets.

    Parameters
    ----------
    routes : list, optional
        The WebSocket URL patterns; gateway.routing's by default.
    """

    def __init__(self, routes=None):
        self.routes = Routes(websocket_urlpatterns if routes is None else routes)
        # channels' check, built once as AllowedHostsOriginValidator builds it; called per handshake.
        self.origins = AllowedHostsOriginValidator(None)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            raise ValueError(f"JobStreamApplication serves WebSocket connections, not {scope['type']!r}")
        routed = self._route(scope)
        if routed is None or not self.origins.valid_origin(self._origin(scope)):
            await self._deny(receive, send)
            return
        app, own_scope = routed
        session_key = self._session_key(scope)
        own_scope["user"] = await session_user(session_key)
        own_scope["session_key"] = session_key  # checked again while the socket lives (gateway.sessions)
        # The server's scope (its headers) is not kept by this frame while the socket lives.
        del scope
        # For a consumer's as_asgi(), the consumer itself: one coroutine less per socket
        # (gateway.adapters.channels).
        await connection_app(app)(own_scope, receive, send)

    def _route(self, scope):
        """The route's consumer and the scope it gets (what channels' URLRouter would put in it
        that the consumer reads), or None."""
        path = scope.get("path", "")
        root_path = scope.get("root_path", "")
        if root_path and not path.startswith(root_path):
            return None
        found = self.routes.match(path[len(root_path) :].lstrip("/"))
        if found is None:
            return None
        app, args, kwargs = found
        own_scope = {
            "type": "websocket",
            "path": scope["path"],
            "query_string": scope.get("query_string", b""),
            "url_route": {"args": args, "kwargs": kwargs},
        }
        return app, own_scope

    @staticmethod
    def _origin(scope):
        """The Origin header parsed as channels' OriginValidator parses it (the last one counts)."""
        origin = None
        for name, value in scope.get("headers", ()):
            if name == b"origin":
                try:
                    origin = urlparse(value.decode("latin1"))
                except ValueError:  # e.g. an unclosed IPv6 bracket: no origin, refused
                    origin = None
        return origin

    @staticmethod
    def _session_key(scope) -> str | None:
        """The session cookie, from the first Cookie header (as channels' CookieMiddleware reads it)."""
        for name, value in scope.get("headers", ()):
            if name == b"cookie":
                return parse_cookie(value.decode("latin1")).get(settings.SESSION_COOKIE_NAME)
        return None

    @staticmethod
    async def _deny(receive, send) -> None:
        """Refuse the handshake (HTTP 403), then wait for the server to say the socket is gone."""
        while True:
            message = await receive()
            if message["type"] == "websocket.connect":
                await send({"type": "websocket.close"})
            elif message["type"] == "websocket.disconnect":
                return
