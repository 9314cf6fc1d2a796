"""uvicorn's WebSocket protocol for a gateway that holds thousands of sockets:
`uvicorn ... --ws gateway.uvicorn:WebSocketProtocol`; and its HTTP protocol with a deadline for a
request's head (`--http gateway.uvicorn:HTTPProtocol`: --timeout-keep-alive seconds).

Chosen once, at import, by gateway.adapters.uvicorn_protocols: within the uvicorn releases tested, uvicorn's
websockets-sansio protocol keeping about 9 KB less per socket; outside them (or with
EXACTLY_ONCE_INTERNALS=off), uvicorn's own protocol, which streams the same.
"""

from __future__ import annotations

from .adapters.uvicorn_protocols import http_protocol, websocket_protocol

WebSocketProtocol = websocket_protocol()
HTTPProtocol = http_protocol()
