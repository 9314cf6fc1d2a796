"""channels' internals the gateway uses, and Django's URL patterns as channels-style routing
matches them: each behind a version check asked once, at import, with a fallback written against
the public API (docs/design/adapters.md: `exactly_once.internals`; EXACTLY_ONCE_INTERNALS=off forces the
fallbacks).

channels, tested 4.1 to 4.3 (the gate: >= 4.1, < 4.4):
- `frames_send(send)`: the send a socket's frames go through, found once per socket (the
  consumer caches it). channels' SessionMiddleware (in AuthMiddlewareStack) wraps the server's
  send in `InstanceSessionWrapper.send`, which saves the session on an HTTP response only: for a
  WebSocket frame it does nothing but read the session twice, a fifth of the per-frame samples
  under uvicorn (bench/REPORT-gateway.md, "Frames skip channels' session wrapper"). The internal:
  the wrapper's class and its `real_send`, unwrapped. Fallback: the send as given (frames go
  through the wrapper; gateway.asgi's application has none).
- `connection_app(app)`: what to await for one connection routed to `app`. For a consumer's
  `as_asgi()`, the consumer instance itself, made from the attributes `as_asgi()` sets on its
  function (`consumer_class`, `consumer_initkwargs`): one coroutine frame less per socket for as
  long as it is open (part of gateway.asgi's 34.2 -> 24.3 KiB a socket, bench/REPORT-gateway.md,
  change 8). Fallback: `app` itself.

Django, tested 5.2 to 6.1 (the gate: >= 5.2, < 6.2):
- `Routes(routes).match(path)`: the route of a WebSocket path. The internal: each route's
  `pattern.match()`, as channels' own URLRouter matches its routes; no resolver and no
  ResolverMatch per handshake. It is Django's, but only channels-style routing (a
  `websocket_urlpatterns` list, as gateway.asgi routes it) uses it, so it lives here. Fallback:
  `django.urls.resolve()` with the routes as its URLconf; the same answers (the callback, the
  captured arguments, the route's default kwargs over the captured ones).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from types import ModuleType
from typing import Any

from django.urls import Resolver404, resolve

from exactly_once.internals import internals

CHANNELS_INTERNALS = internals("gateway.adapters.channels", "channels", "4.1", "4.4")
URL_PATTERN_INTERNALS = internals("gateway.adapters.channels.url_patterns", "django", "5.2", "6.2")

Send = Callable[[dict[str, Any]], Awaitable[None]]
# A route's callback, its positional and its keyword arguments.
Match = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]

if CHANNELS_INTERNALS:
    from channels.sessions import InstanceSessionWrapper

    def frames_send(send: Send) -> Send:
        """The server's own send, under any session wrappers of channels' SessionMiddleware."""
        while isinstance(getattr(send, "__self__", None), InstanceSessionWrapper):
            send = send.__self__.real_send  # type: ignore[attr-defined]
        return send

    def connection_app(app: Any) -> Any:
        """The consumer instance `app` (a consumer's `as_asgi()`) would make, or `app`."""
        consumer_class = getattr(app, "consumer_class", None)
        if consumer_class is None:
            return app
        return consumer_class(**app.consumer_initkwargs)

else:

    def frames_send(send: Send) -> Send:
        """The send as given."""
        return send

    def connection_app(app: Any) -> Any:
        """`app` itself."""
        return app


class PatternRoutes:
    """Routes matched by their patterns, as channels' URLRouter matches them."""

    def __init__(self, routes: Sequence[Any]) -> None:
        self.routes = routes

    def match(self, path: str) -> Match | None:
        """The route of `path` (no leading slash), or None."""
        for route in self.routes:
            found = route.pattern.match(path)
            if found:
                _, args, kwargs = found
                return route.callback, args, {**kwargs, **route.default_args}
        return None


class ResolvedRoutes:
    """Routes resolved by Django's public `resolve()`, with the routes as its URLconf."""

    def __init__(self, routes: Sequence[Any]) -> None:
        # A module: resolve() takes a URLconf module (and caches a resolver per module).
        self.urlconf = ModuleType(f"{__name__}.routes")
        self.urlconf.urlpatterns = routes  # type: ignore[attr-defined]

    def match(self, path: str) -> Match | None:
        """The route of `path` (no leading slash), or None."""
        try:
            # django-stubs type urlconf as a dotted path; Django takes the module itself too.
            found = resolve(f"/{path}", urlconf=self.urlconf)  # type: ignore[arg-type]
        except Resolver404:
            return None
        return found.func, found.args, found.kwargs


Routes = PatternRoutes if URL_PATTERN_INTERNALS else ResolvedRoutes
