"""uvicorn's WebSocket protocol for a gateway that holds thousands of sockets:
`uvicorn ... --ws gateway.uvicorn:WebSocketProtocol`.

Chosen once, at import, by gateway.adapters.uvicorn: within the uvicorn releases tested, uvicorn's
websockets-sansio protocol keeping about 9 KB less per socket; outside them (or with
EXACTLY_ONCE_INTERNALS=off), uvicorn's own protocol, which streams the same.
"""

from __future__ import annotations

from .adapters.uvicorn import websocket_protocol

WebSocketProtocol = websocket_protocol()
