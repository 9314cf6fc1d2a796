"""ASGI entry of the jobs benchmark's baselines (bench/jobs_baselines.py): HTTP to Django, WebSocket
to their consumers behind Channels' usual stack (the Origin checked against ALLOWED_HOSTS, the
session's user, the routes), as Channels' documentation builds it."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.jobs_settings")
django_asgi_app = get_asgi_application()  # sets Django up before the imports below

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from bench.jobs_baselines import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
