"""What the ASGI servers the gateway runs under (daphne, uvicorn) have that ASGI does not say."""

from __future__ import annotations

from .adapters.uvicorn_protocols import CLIENT_GONE


def _client_gone() -> tuple[type[BaseException], ...]:
    gone: list[type[BaseException]] = []
    try:
        from autobahn.exception import Disconnected  # daphne's WebSocket stack

        gone.append(Disconnected)
    except ImportError:
        pass
    return (*gone, *CLIENT_GONE)  # uvicorn's (gateway.adapters.uvicorn_protocols), if it is installed


# Raised by a send to a client whose connection just dropped: nothing failed, nothing to close.
# The servers not installed are left out (catching () catches nothing).
ClientGone = _client_gone()
