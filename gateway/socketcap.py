"""The cap on job stream sockets per user: GATEWAY["MAX_SOCKETS_PER_USER"], counted in each server
process (one dict of the process, no Redis round trip per socket, nothing left behind by a
process that dies). A user's N+1th socket in one process is closed with 4429; with P processes
behind a proxy a user holds at most N x P sockets.
"""

from __future__ import annotations

from collections.abc import Hashable

from .conf import gateway_settings


class SocketCount:
    """Open sockets by user id, in this process."""

    def __init__(self) -> None:
        self._open: dict[Hashable, int] = {}

    def take(self, user_id: Hashable) -> bool:
        """Count one socket more for the user, unless that would pass the cap (False then)."""
        cap = gateway_settings.MAX_SOCKETS_PER_USER
        held = self._open.get(user_id, 0)
        if cap and held >= cap:
            return False
        self._open[user_id] = held + 1
        return True

    def release(self, user_id: Hashable) -> None:
        """One of the user's sockets closed."""
        held = self._open.get(user_id, 0) - 1
        if held > 0:
            self._open[user_id] = held
        else:
            self._open.pop(user_id, None)

    def held(self, user_id: Hashable) -> int:
        return self._open.get(user_id, 0)

    def clear(self) -> None:
        """Forget every count (a test's sockets dropped without a disconnect)."""
        self._open.clear()


sockets_per_user = SocketCount()
