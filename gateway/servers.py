"""What the ASGI servers the gateway runs under (daphne, uvicorn) have that ASGI does not say."""

from __future__ import annotations


def _client_gone() -> tuple[type[BaseException], ...]:
    gone: list[type[BaseException]] = []
    try:
        from autobahn.exception import Disconnected  # daphne's WebSocket stack

        gone.append(Disconnected)
    except ImportError:
        pass
    try:
        from uvicorn.protocols.utils import ClientDisconnected

        gone.append(ClientDisconnected)
    except ImportError:
        pass
    return tuple(gone)


# Raised by a send to a client whose connection just dropped: nothing failed, nothing to close.
# The servers not installed are left out (catching () catches nothing).
ClientGone = _client_gone()
