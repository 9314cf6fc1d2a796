"""Sockets whose session ended since they were authorized (a logout, a password change, the
user deactivated): closed with 4401 within GATEWAY["SESSION_CHECK_SECONDS"].

A socket is authorized once, at connect. A process holds thousands, so they are not checked one
by one, nor each by a task of its own: every socket keeps its session key and its user's id, and
one task per process (per event loop) checks the distinct sessions of its sockets in bulk every
interval, as `django.contrib.auth.get_user` checks a request's: the session exists and has not
expired, names the same user with an authentication backend still in AUTHENTICATION_BACKENDS,
the backend still lets the user in (ModelBackend: `is_active`), and the session's auth hash is
still the user's (`get_session_auth_hash()`: it changes with the password). Sessions stored in
the database (SESSION_ENGINE `db`, `cached_db` or a subclass) are read in one query per
BATCH keys; other engines one `SessionStore(key).load()` each. Users are read in one query per
BATCH ids. A check that fails (the database away) closes nothing: the next one tries again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from importlib import import_module
from typing import Any, Protocol

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import (
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    get_user_model,
    load_backend,
)
from django.contrib.sessions.backends.db import SessionStore as DatabaseSessionStore
from django.core.exceptions import ValidationError
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from .conf import gateway_settings
from .loops import PerLoop

logger = logging.getLogger(__name__)

BATCH = 500  # keys or ids per query: well under any database's limit on parameters

Claim = tuple[str, Any]  # (session key, the id of the user the socket was authorized for)


class Watched(Protocol):
    session_key: str
    user_id: Any

    def session_ended(self) -> None:
        """Close the socket with 4401 (called on the event loop)."""


def load_sessions(keys: Iterable[str]) -> dict[str, dict]:
    """The data of each session that exists and has not expired, by key (those absent: not)."""
    store_class = import_module(settings.SESSION_ENGINE).SessionStore
    keys = list(keys)
    found: dict[str, dict] = {}
    if issubclass(store_class, DatabaseSessionStore):  # the database holds them: read in bulk
        model, store = store_class.get_model_class(), store_class()
        now = timezone.now()
        for start in range(0, len(keys), BATCH):
            rows = model.objects.filter(session_key__in=keys[start : start + BATCH], expire_date__gt=now)
            for key, data in rows.values_list("session_key", "session_data"):
                found[key] = store.decode(data)
        return found
    for key in keys:
        data = store_class(key).load()  # {} when missing or expired, whatever the engine
        if data:
            found[key] = data
    return found


def ended_sessions(claims: Iterable[Claim]) -> set[Claim]:
    """The claims whose session no longer lets their user in (see the module's docstring)."""
    claims = set(claims)
    sessions = load_sessions({key for key, _ in claims})
    user_model = get_user_model()
    ids = {user_id for _, user_id in claims}
    users: dict = {}
    id_list = list(ids)
    for start in range(0, len(id_list), BATCH):
        users.update(user_model._default_manager.in_bulk(id_list[start : start + BATCH]))
    backends: dict[str, Any] = {}
    return {
        (key, user_id)
        for key, user_id in claims
        if not _lets_in(sessions.get(key), users.get(user_id), user_id, backends)
    }


def _lets_in(session: dict | None, user, user_id, backends: dict) -> bool:
    if not session or user is None:
        return False
    try:
        if get_user_model()._meta.pk.to_python(session[SESSION_KEY]) != user_id:
            return False
        backend_path = session[BACKEND_SESSION_KEY]
    except (KeyError, ValidationError):
        return False
    if backend_path not in settings.AUTHENTICATION_BACKENDS:
        return False
    if backend_path not in backends:
        backends[backend_path] = load_backend(backend_path)
    user_can_authenticate = getattr(backends[backend_path], "user_can_authenticate", None)
    if user_can_authenticate is not None and not user_can_authenticate(user):
        return False  # ModelBackend: the user was deactivated
    if not hasattr(user, "get_session_auth_hash"):
        return True
    session_hash = session.get(HASH_SESSION_KEY)
    if not session_hash:
        return False
    # The hashes of SECRET_KEY_FALLBACKS count too, as get_user's do.
    return constant_time_compare(session_hash, user.get_session_auth_hash()) or any(
        constant_time_compare(session_hash, fallback) for fallback in user.get_session_auth_fallback_hash()
    )


class SessionWatch:
    """The process's sockets that have a session, and the task that checks them."""

    def __init__(self) -> None:
        self._sockets: set[Watched] = set()
        self._task: asyncio.Task | None = None

    def add(self, socket: Watched) -> None:
        if not gateway_settings.SESSION_CHECK_SECONDS:
            return  # checks turned off
        self._sockets.add(socket)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="gateway-session-watch")

    def discard(self, socket: Watched) -> None:
        self._sockets.discard(socket)

    async def _run(self) -> None:
        while self._sockets:
            await asyncio.sleep(gateway_settings.SESSION_CHECK_SECONDS or 60)
            try:
                await self.check()
            except Exception:
                logger.warning(
                    "gateway: the sockets' sessions could not be checked; next time", exc_info=True
                )

    async def check(self) -> int:
        """Check every socket's session now; close those that ended. Returns how many closed."""
        sockets = list(self._sockets)
        if not sockets:
            return 0
        ended = await database_sync_to_async(ended_sessions)({(s.session_key, s.user_id) for s in sockets})
        closed = 0
        for socket in sockets:
            if (socket.session_key, socket.user_id) in ended and socket in self._sockets:
                self._sockets.discard(socket)
                socket.session_ended()
                closed += 1
        if closed:
            logger.info("gateway: %d socket(s) closed 4401, their session ended", closed)
        return closed

    async def close(self) -> None:
        self._sockets.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=2)


_watches: PerLoop[SessionWatch] = PerLoop(lambda: SessionWatch(), lambda watch: watch.close())


def get_session_watch() -> SessionWatch:
    """The session watch of the running event loop (one per process under daphne or uvicorn)."""
    return _watches.get()


async def close_session_watch() -> None:
    """Stop the running loop's watch (tests; a process's watch otherwise lives as long as it)."""
    await _watches.close()
