"""The gateway (L4): the jobs API, the page, and each job's events live over a WebSocket.

Its public API, importable from here: `JobStreamApplication`, for the "websocket" slot of a
project's ProtocolTypeRouter, or channels' own stack over `websocket_urlpatterns` (routed to
`JobStreamConsumer`); `RequestBodyLimit`, around the "http" application, refusing a request body
over GATEWAY["MAX_BODY_SIZE"] (413) before it is read (`RequestBodyLimitMiddleware` under WSGI).
The jobs API and the page are URLs (`include("gateway.urls")`), uvicorn's
protocol a command-line path (`--ws gateway.uvicorn:WebSocketProtocol`, the `uvicorn` extra).
Each name is imported on first use: Django imports the package (INSTALLED_APPS) before its app
registry is ready, so importing it must not pull in models, Redis clients or settings.
"""

_EXPORTS = {
    "JobStreamApplication": "gateway.asgi",
    "JobStreamConsumer": "gateway.consumers",
    "RequestBodyLimit": "gateway.bodylimit",
    "RequestBodyLimitMiddleware": "gateway.bodylimit",
    "websocket_urlpatterns": "gateway.routing",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gateway' has no attribute {name!r}")
