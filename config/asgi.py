"""ASGI entry point: HTTP goes to Django, WebSocket to the gateway's routes."""

import gc

from django.core.asgi import get_asgi_application

from config.entrypoints import require_settings_module

# No default: a server started without DJANGO_SETTINGS_MODULE refuses (config.entrypoints).
require_settings_module("config.asgi")
django_asgi_app = get_asgi_application()  # sets Django up before the imports below

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from gateway.asgi import JobStreamApplication  # noqa: E402
from gateway.bodylimit import RequestBodyLimit  # noqa: E402

http_app = django_asgi_app
if settings.SERVE_STATIC:
    # daphne serves no static files itself; in development and tests Django does. In
    # production, collectstatic and let the front server (or CDN) serve STATIC_ROOT.
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    http_app = ASGIStaticFilesHandler(django_asgi_app)

application = ProtocolTypeRouter(
    {
        # A body over GATEWAY["MAX_BODY_SIZE"] is refused (413) before Django reads it.
        "http": RequestBodyLimit(http_app),
        # The origin check, session auth and routes of channels' AllowedHostsOriginValidator,
        # AuthMiddlewareStack and URLRouter, in one layer that keeps nothing per socket.
        "websocket": JobStreamApplication(),
    }
)

# Everything imported so far lives as long as the process: out of the cyclic GC's reach, a full
# collection walks only what the connections made (with thousands of sockets, each one paused
# every socket's frames for tens to hundreds of ms; bench/REPORT-gateway.md).
gc.freeze()
