"""WebSocket routes (the job stream consumer arrives with the gateway)."""

websocket_urlpatterns = []
