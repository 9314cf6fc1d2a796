"""The job stream: /ws/jobs/<job_id>/?last_seq=N sends every event of the job with
seq > N, in seq order, each once, across reconnects.

A socket subscribes to the job's channel first, then backfills from the job's history, then
streams live events. Every event carries `prev_seq` (the job's event before it), so the
socket can tell "next in line" (prev_seq <= last sent: send it), "already sent" (seq <= last
sent: drop it) and "something is missing" (prev_seq > last sent: backfill from history).
When the history no longer holds what is missing, the client gets a `reset` frame with the
job's state snapshot and `recovered: false`: never a silent gap. A client of a job that ended
(the database says so) never waits for an event that will not come: when Redis has nothing of
the job left, or no final event of it, the client gets the outcome as a reset from the database.

Close codes: 4400 bad parameters, 4401 not logged in (at connect, or the session ended since:
a logout, a password change, the user deactivated; gateway.sessions checks them every
GATEWAY["SESSION_CHECK_SECONDS"]), 4404 no such job or not yours (one code
for both, as the HTTP API's 404: a stranger learns nothing), 4429 the user holds
GATEWAY["MAX_SOCKETS_PER_USER"] sockets in this process already (gateway.socketcap), 4008 client
too slow, 1003 the client sent a data frame (the stream is one-way: it sends nothing but pings,
which the server answers), 1011 the server failed (the client resumes with last_seq), or refuses
to stream from a Redis that is not safe for the bus (EVENTBUS["REDIS_DURABILITY"] = "refuse").
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import uuid
from datetime import timedelta
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.core.exceptions import ImproperlyConfigured
from django.db import InterfaceError, OperationalError
from django.utils import timezone
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eventbus.models import Job
from eventbus.pubsub import MAX_SEQ, MAX_SEQ_DIGITS, events_kept_seconds, job_channel
from eventbus.selectors import job_outcome, job_to_stream

from . import eager
from .adapters.channels import frames_send
from .adapters.uvicorn_protocols import reporting_gone
from .backoff import retrying
from .conf import gateway_settings
from .hub import Frame, History, get_hub
from .servers import ClientGone
from .sessions import get_session_watch
from .socketcap import sockets_per_user
from .states import job_state

logger = logging.getLogger(__name__)

BAD_REQUEST, NOT_LOGGED_IN, NOT_FOUND, TOO_SLOW = 4400, 4401, 4404, 4008
TOO_MANY_SOCKETS, UNSUPPORTED_DATA = 4429, 1003
# A lost or refused database connection (database_sync_to_async drops it: the next try gets a new one).
DATABASE_AWAY = (OperationalError, InterfaceError)


class RefuseConnection(Exception):
    def __init__(self, code: int, detail: str):
        super().__init__(detail)
        self.code, self.detail = code, detail


def parse_last_seq(query_string: bytes) -> int:
    try:
        params = parse_qs(query_string.decode("ascii"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise RefuseConnection(BAD_REQUEST, "The query string is not ASCII.") from None
    values = params.get("last_seq", ["0"])
    if (
        len(values) != 1
        or not (values[0].isascii() and values[0].isdigit())
        or len(values[0]) > MAX_SEQ_DIGITS
    ):
        raise RefuseConnection(BAD_REQUEST, "last_seq must be one integer >= 0.")
    last_seq = int(values[0])
    if last_seq > MAX_SEQ:
        raise RefuseConnection(BAD_REQUEST, "last_seq must be one integer >= 0.")
    return last_seq


def parse_job_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise RefuseConnection(BAD_REQUEST, "The job id is not a UUID.") from None


find_job = database_sync_to_async(job_to_stream)


def is_final_event(event: dict) -> bool:
    """The job's final event (its data says `"final": true`)."""
    data = event.get("data")
    return isinstance(data, dict) and data.get("final") is True


class JobStreamConsumer(AsyncWebsocketConsumer):
    """One socket. It has no task of its own while it streams live: the hub hands it each
    frame and it sends it there and then (gateway.eager). A task runs only while the socket
    catches up (a backfill from the history, at the start, after a gap or a Redis blip) or
    waits for a client that stopped reading; live frames wait in its backlog meanwhile."""

    channel: str | None = None
    job_id = domain = ""
    last_sent = 0
    # Frames that came while a catch-up runs; made when the first comes (an empty deque is 624
    # bytes, for each of thousands of sockets that are live almost all the time).
    backlog: collections.deque[Frame] | None = None
    live = False  # no task owns the sending: a frame in line is sent by deliver() itself
    catching_up: asyncio.Task | None = None
    resync_due = False  # the next step of the catch-up is a backfill
    state_check: asyncio.Future | None = None  # the job's state, read again (gateway.states)
    # The close of a socket that failed or fell behind: kept, the loop holds a task weakly.
    closer: asyncio.Task | None = None
    closing = False
    outcome_sent = False  # a reset told the client how the job ended
    state_stale = False  # self.job.state may be out of date (Redis went away since)
    # The session the socket was authorized with, and its user: checked again (gateway.sessions).
    session_key: str | None = None
    user_id = None
    counted_user = None  # the user whose socket count this socket holds one of (gateway.socketcap)

    async def __call__(self, scope, receive, send):
        """channels' consumer loop without its task per receive and its wait on them: this
        consumer uses no channel layer, so the server's receive is all it reads (one task per
        socket, the server's, instead of two)."""
        self.scope = scope
        # The server's send, and the one frames go through: the server's own, past channels' session
        # wrapper (gateway.adapters.channels). That wrapper saves the session on an HTTP response;
        # for a WebSocket frame it does nothing but read the session twice, a fifth of the work per
        # frame under uvicorn. Both are wrapped only where uvicorn's error for a client gone is not
        # known (gateway.adapters.uvicorn_protocols).
        self.base_send = reporting_gone(send)
        self.server_send = reporting_gone(frames_send(send))
        self.channel_layer = None
        try:
            while True:
                await self.dispatch(await receive())
        except StopConsumer:
            pass

    async def connect(self):
        # Accept first: a close code can only reach the client on an open socket.
        await self.accept()
        # The user is needed to authorize the socket, not afterwards (gateway.asgi's scope is the
        # consumer's own; channels' URLRouter gives it a copy of its own too).
        user = self.scope.pop("user", None)
        # gateway.asgi gives the session's key; channels' SessionMiddleware the session itself.
        session_key = self.scope.pop("session_key", None) or getattr(
            self.scope.get("session"), "session_key", None
        )
        try:
            job_id = parse_job_id(self.scope["url_route"]["kwargs"]["job_id"])
            self.last_sent = parse_last_seq(self.scope.get("query_string", b""))
            if user is None or not user.is_authenticated:
                raise RefuseConnection(NOT_LOGGED_IN, "Log in first.")
            # Counted before the first await, so that sockets opened at once are counted alike.
            if not sockets_per_user.take(user.pk):
                raise RefuseConnection(TOO_MANY_SOCKETS, "Too many open sockets: close one first.")
            self.counted_user = user.pk
            self.job = await retrying(
                lambda: find_job(user, job_id),
                DATABASE_AWAY,
                f"job socket {job_id}: the database is away",
                logger,
                stop=lambda: self.closing,
            )
            if self.closing:
                return
            if self.job is None:
                raise RefuseConnection(NOT_FOUND, "No such job.")
        except RefuseConnection as refusal:
            await self.refuse(refusal.code, refusal.detail)
            return
        if session_key:
            self.session_key, self.user_id = session_key, user.pk
            get_session_watch().add(self)
        self.hub = get_hub()
        try:
            await self.hub.check_durability()
        except ImproperlyConfigured:
            await self.refuse(1011, "The server's event store is not safe to stream from; see its log.")
            return
        self.job_id, self.domain = str(self.job.id), self.job.domain
        self.channel = job_channel(self.domain, self.job_id)
        await self.hub.add(self.channel, self)  # subscribed before the history is read
        if not self.closing:
            self.resync_due = True  # first the backfill
            self.catching_up = asyncio.create_task(self._catch_up())

    async def refuse(self, code: int, detail: str) -> None:
        """Send an error frame, then close the socket.

        Parameters
        ----------
        code : int
            The close code, also the error frame's `code`.
        detail : str
            The error frame's `detail`.
        """
        self.closing = True
        await self.send(text_data=json.dumps({"type": "error", "code": code, "detail": detail}))
        await self.close(code)

    async def disconnect(self, code):
        """channels' hook when the socket closes: the consumer stops and lets go of what it holds.

        Parameters
        ----------
        code : int
            The close code.
        """
        self.closing = True
        self.live = False
        if self.counted_user is not None:
            sockets_per_user.release(self.counted_user)
            self.counted_user = None
        if self.session_key:
            get_session_watch().discard(self)
        if self.channel:
            await self.hub.remove(self.channel, self)
        if self.state_check and not self.state_check.done():
            self.state_check.remove_done_callback(self._state_read)  # shared: not cancelled
        task = self.catching_up
        if task and not task.done():
            task.cancel()
            # Wait for it: a task left pending would outlive its socket.
            await asyncio.wait({task}, timeout=2)

    async def receive(self, text_data=None, bytes_data=None):
        """channels' hook for a frame the client sends: the stream is one-way, so the socket
        closes (1003).

        Parameters
        ----------
        text_data : str, optional
            A text frame.
        bytes_data : bytes, optional
            A binary frame.
        """
        # The stream is one-way (the client resumes by reconnecting with last_seq): a client that
        # sends data is not one of ours, and is not kept to send more.
        if not self.closing:
            logger.info("job socket %s: the client sent a data frame; closing 1003", self.job_id)
            self._close_with(UNSUPPORTED_DATA, "The stream is one-way: send nothing.")

    # Called by the hub, synchronously, on the event loop.
    def deliver(self, frame: Frame) -> None:
        """Called by the hub, synchronously, on the event loop: send a live event's frame, hold
        it, or catch up from the history when events before it are missing.

        Parameters
        ----------
        frame : Frame
            The event's frame.
        """
        if not self.live:
            self._hold(frame)
        elif frame.seq <= self.last_sent:
            pass  # already sent (a backfill got there first)
        elif frame.prev_seq > self.last_sent:
            # Something between is missing: the history has it.
            self._hold(frame)
            self._start_catching_up()
        else:
            self._send_now(frame)

    def resync(self) -> None:
        # Redis went away: the job may have ended meanwhile with its final event lost (not
        # published, or gone with Redis), so the database's word is due again.
        self.state_stale = True
        self._start_catching_up()

    def _start_catching_up(self) -> None:
        if self.closing:
            return
        self.resync_due = True
        if self.live:
            self.live = False
            self.catching_up = asyncio.get_running_loop().create_task(self._catch_up())
        # else: the running catch-up reads the history again before it goes live

    def _hold(self, frame: Frame) -> None:
        if self.closing:
            return
        if self.backlog is None:
            self.backlog = collections.deque()
        if len(self.backlog) >= gateway_settings.QUEUE_SIZE:
            logger.info("job socket %s fell %d frames behind: closing 4008", self.job_id, len(self.backlog))
            self._close_with(TOO_SLOW, "Too slow: reconnect with last_seq to resume.")
            return
        self.backlog.append(frame)

    def _send_now(self, frame: Frame) -> None:
        self.last_sent = frame.seq
        try:
            waiting = eager.start(self._transmit(frame))
        except ClientGone:
            self._client_left()
        except Exception:
            self._failed()
        else:
            if waiting is not None:
                # The client's buffer is full: the next frames wait in the backlog until it drains.
                self.live = False
                self.catching_up = asyncio.get_running_loop().create_task(self._catch_up(waiting))

    def _transmit(self, frame: Frame):
        """The server's send of the frame."""
        return self.server_send(frame.message)

    async def _send(self, frame: Frame) -> None:
        self.last_sent = frame.seq
        await self._transmit(frame)

    async def _catch_up(self, waiting: asyncio.Future | None = None) -> None:
        """Backfill while one is due, send the backlog, then go live. Runs while `live` is False."""
        try:
            if waiting is not None:
                await waiting
            while not self.closing:
                if self.resync_due:
                    self.resync_due = False
                    await self._backfill_when_redis_answers()
                    continue
                if not self.backlog:
                    self.backlog = None
                    self.live = True  # no await since the backlog was seen empty: nothing slips by
                    return
                frame = self.backlog.popleft()
                if frame.seq <= self.last_sent:
                    continue  # already sent (the backfill got there first)
                if frame.prev_seq > self.last_sent:
                    self.resync_due = True  # something between is missing: the history has it
                    continue
                await self._send(frame)
        except asyncio.CancelledError:
            raise
        except ClientGone:
            self._client_left()
        except Exception:
            self._failed()
        finally:
            if self.catching_up is asyncio.current_task():
                self.catching_up = None

    def _client_left(self) -> None:
        # The client went away while we sent (its disconnect is on its way to us): nothing
        # failed, and there is no socket left to close.
        self.closing = True
        self.live = False
        logger.info("job socket %s: the client left mid-send", self.job_id)

    def _failed(self) -> None:
        logger.exception("job socket %s failed; closing 1011 (the client resumes with last_seq)", self.job_id)
        self.closing = True
        self.live = False
        self.closer = asyncio.get_running_loop().create_task(self.close(1011))

    def session_ended(self) -> None:
        """Called by the session watch: the session the socket was authorized with ended."""
        if not self.closing:
            logger.info("job socket %s: its session ended; closing 4401", self.job_id)
            self._close_with(NOT_LOGGED_IN, "Your session ended: log in again.")

    def _close_with(self, code: int, detail: str) -> None:
        """Stop sending, then send the error frame and close, in a task of its own (kept: the loop
        holds a task weakly)."""
        self.closing = True
        self.live = False
        self.closer = asyncio.get_running_loop().create_task(self._close(code, detail))

    async def _close(self, code: int, detail: str) -> None:
        task = self.catching_up
        if task and task is not asyncio.current_task():
            task.cancel()
        await self.send(text_data=json.dumps({"type": "error", "code": code, "detail": detail}))
        await self.close(code)

    async def _backfill_when_redis_answers(self) -> None:
        """A Redis blip (or a lost database connection, for the job's outcome) must not cost
        the client its socket: retry until they answer."""
        await retrying(
            self._backfill,
            (RedisConnectionError, RedisTimeoutError, *DATABASE_AWAY),
            f"job socket {self.job_id}: history unreadable",
            logger,
            stop=lambda: self.closing,
        )

    async def _backfill(self) -> None:
        history = await self.hub.backfill(self.channel, self.domain, self.job_id, after=self.last_sent)
        frames, latest = history.frames, history.latest
        if self._reset_due(history):
            await self._reset(latest) if latest is not None else await self._reset_expired()
        for frame in frames:
            if frame.seq > self.last_sent:
                await self._send(frame)
        if self._outcome_due(latest):
            await self._reset_expired()

    def resynced(self, history: History) -> None:
        """After a Redis blip the hub read the job's history once for every live socket of the
        job: send what follows this socket's last seq as if it came live, when that is all it
        needs (the common case, and no task of its own); a reset or the job's outcome due is
        left to a catch-up of its own.

        Parameters
        ----------
        history : History
            The job's history, as the hub read it.
        """
        self.state_stale = True
        if not self.live or self._reset_due(history) or self.job.ended:
            self._start_catching_up()
            return
        for frame in history.frames:
            self.deliver(frame)  # sent, dropped as sent already, or held behind a catch-up
        if self.live:
            self._outcome_due(history.latest)

    def _reset_due(self, history: History) -> bool:
        """The history does not reach back to what the client has, and the client is to be reset
        to the job's state. Either the router has applied nothing newer yet (wait for it: the
        state KV runs ahead, written at publish time), or what the client misses expired: reset
        it. The client saw events the router forgot: they expired, or (a job younger than the
        keys' TTL) a failover or restart lost them, and the job's run republishes them: wait for
        it then, rather than reset a client that will get every event."""
        first = next((f for f in history.frames if f.seq > self.last_sent), None)
        if first is not None and first.prev_seq <= self.last_sent:
            return False  # the history goes on from the client's last seq
        applied = history.applied
        expired = applied is None and self.last_sent > 0 and self._keys_may_have_expired()
        return first is not None or expired or int(applied or 0) > self.last_sent

    def _keys_may_have_expired(self) -> bool:
        return timezone.now() - self.job.accepted_at >= timedelta(seconds=events_kept_seconds())

    def _outcome_due(self, latest: dict | None) -> bool:
        """The client now waits for the job's next event: unless none will come. That is when
        the job ended (the database says so), no newer event is on its way (the state KV,
        written as each event is published, holds none the client lacks), and the client has
        no final event: Redis lost it or it was never published (the job failed with Redis
        down, its keys expired...). Then the client is due the outcome from the database (True).
        After a blip the job's state is read again first, off the sending (a state check)."""
        if self.outcome_sent:
            return False
        if latest is not None and (int(latest.get("seq", 0)) > self.last_sent or is_final_event(latest)):
            return False  # on its way (the router has it), or the client has the end already
        if self.job.ended:
            return True
        if self.state_stale and (self.state_check is None or self.state_check.done()):
            # Off the catch-up: after a Redis blip every socket resyncs at once, and their
            # frames must not wait behind one database read each.
            self.state_stale = False
            self.state_check = job_state(self.job.pk)
            self.state_check.add_done_callback(self._state_read)
        return False

    def _state_read(self, state: asyncio.Future) -> None:
        """The job's state, read from the database again after a blip: if it ended, the socket
        catches up again (and gets the outcome unless an event brings it)."""
        if self.closing:
            return
        if state.cancelled() or state.exception() is not None:
            logger.warning("job socket %s: could not read the job's state (%r)", self.job_id, state)
            self.state_stale = True  # the next resync tries again
            return
        if state.result() in Job.FINAL_STATES:
            self.job.state = state.result()
            self._start_catching_up()

    async def _reset(self, state: dict) -> None:
        await self.send(text_data=json.dumps({"type": "reset", "recovered": False, "state": state}))
        self.last_sent = max(self.last_sent, int(state.get("seq", 0)))

    async def _reset_expired(self) -> None:
        """The job's state expired from Redis: the database has its outcome."""
        job = await database_sync_to_async(job_outcome)(self.job.pk)
        self.job.state = job.state
        await self._reset(
            {
                "job_id": str(job.pk),
                "domain": job.domain,
                "state": job.state,
                "seq": self.last_sent,
            }
        )
        self.outcome_sent = job.ended
