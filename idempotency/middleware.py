"""The Idempotency-Key middleware: the request/response edge only; storage is the store's.

It sits last in MIDDLEWARE and, for a covered request that carries a key, calls the view
itself, so that the view's transaction can also store its answer (see execution.py).

It runs in either mode (Django's sync_capable / async_capable). Under ASGI, a request it does
not cover goes through without leaving the event loop; a keyed one makes one trip to a worker
thread for the database work and the view (where Django would run a sync view anyway).

The order of work for a keyed request: authenticate (resolve its scope), parse the key, and
only then fingerprint the body (docs/howto/idempotent-views.md, Replays and authentication): a request that is not authenticated, or whose key
is malformed, is refused without its body being read.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.db import InterfaceError, OperationalError, close_old_connections

from exactly_once.tracing import TRACING, annotate, span

from . import metrics
from .conf import idempotency_settings
from .context import keyed_work
from .exceptions import (
    DatabaseUnavailable,
    IdempotencyInProgress,
    IdempotencyKeyInvalid,
    IdempotencyKeyMismatch,
    IdempotencyKeyMissing,
    LeaseLost,
)
from .execution import IdempotencyContext, Ran, Verdict, run_leased, run_locked, transaction_aliases
from .fingerprint import request_fingerprint
from .keys import IdemKey, InvalidKey
from .policy import OPTIONAL, policy_for
from .problems import problem_from_error
from .responses import STORED_HEADER, StoredResponse, capture, is_refusal, is_storable, refused_status, replay
from .scope import resolve_scope
from .stores.base import Acquisition, Outcome
from .throttling import throttled_answer

# A lost or refused database connection: the request's transaction, if any, is gone with it.
CONNECTION_ERRORS = (OperationalError, InterfaceError)

logger = logging.getLogger(__name__)


def count(outcome: str) -> None:
    """Count a keyed request's outcome (idempotency.metrics), and name it on the request's span
    (tracing on)."""
    metrics.count(outcome)
    if TRACING:
        annotate(outcome=outcome)


def call_view(view_func, request, args, kwargs):
    """The view's response, rendered (its body is what gets stored)."""
    if iscoroutinefunction(view_func):
        view_func = async_to_sync(view_func)
    response = view_func(request, *args, **kwargs)
    if response is None:
        raise ValueError(f"The view {view_func!r} returned None instead of an HttpResponse.")
    if callable(getattr(response, "render", None)) and not getattr(response, "is_rendered", True):
        response = response.render()
    return response


def answer_of(response) -> StoredResponse | Verdict:
    if is_storable(response):
        return capture(response)
    return Verdict.RELEASE if is_refusal(response) else Verdict.FAIL


def error_verdict(exc: BaseException) -> Verdict:
    """An exception Django answers with a refusal (400, 403) frees the key like that refusal."""
    status = refused_status(exc)
    return Verdict.RELEASE if status in idempotency_settings.NOT_STORED_STATUSES else Verdict.FAIL


def refusal(acquisition: Acquisition):
    """The answer of a key whose record answers instead of the view: replay, 409 or 422."""
    if acquisition.outcome is Outcome.REPLAY:
        count("replay")
        assert acquisition.response is not None
        return replay(acquisition.response)
    if acquisition.outcome is Outcome.IN_FLIGHT:
        count("conflict")
        return problem_from_error(IdempotencyInProgress(retry_after=acquisition.retry_after))
    count("mismatch")
    return problem_from_error(
        IdempotencyKeyMismatch(
            f"This {idempotency_settings.HEADER} was used for a request with another method, path, "
            "query string or body."
        )
    )


def keyed_policy(request, view_func):
    """The policy of a request this middleware handles (None: it lets the request through)."""
    policy = policy_for(view_func, request.method)
    if policy is None or (policy.mode == OPTIONAL and idempotency_settings.HEADER not in request.headers):
        return None
    return policy


class IdempotencyMiddleware:
    """The middleware of keyed requests: each view marked with `idempotency_key` runs once per
    (scope, key), and a retry gets the first answer.

    Parameters
    ----------
    get_response : callable
        The next middleware or the view, sync or async (the middleware is then async too).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
            # Django adapts process_view by what it is: a coroutine function keeps it on the loop.
            self.process_view = self.aprocess_view

    def __call__(self, request):
        if self.is_async:
            return self.__acall__(request)
        return self.get_response(request)

    async def __acall__(self, request):
        return await self.get_response(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        """Run a keyed request's view once for its key; let any other request through.

        Parameters
        ----------
        request : HttpRequest
            The request.
        view_func : callable
            The view it is routed to, whose marker says its policy.
        view_args, view_kwargs
            The view's arguments.

        Returns
        -------
        HttpResponse or None
            The view's answer, stored or replayed; None lets the request through.
        """
        policy = keyed_policy(request, view_func)
        return None if policy is None else self.guarded(request, policy, view_func, view_args, view_kwargs)

    async def aprocess_view(self, request, view_func, view_args, view_kwargs):
        """`process_view` under ASGI: one trip to the thread Django runs sync views in.

        Parameters
        ----------
        request : HttpRequest
            The request.
        view_func : callable
            The view it is routed to.
        view_args, view_kwargs
            The view's arguments.

        Returns
        -------
        HttpResponse or None
        """
        policy = keyed_policy(request, view_func)
        if policy is None:
            return None
        # One trip to the thread Django runs sync views in: the database work and the view share
        # its connection and transaction.
        return await sync_to_async(self.guarded)(request, policy, view_func, view_args, view_kwargs)

    def guarded(self, request, policy, view_func, view_args, view_kwargs):
        """`keyed`, answering a failed database connection with a 503 instead of a 500.

        Parameters
        ----------
        request : HttpRequest
            The request.
        policy : ViewPolicy
            The view's policy (its marker).
        view_func : callable
            The view.
        view_args, view_kwargs
            The view's arguments.

        Returns
        -------
        HttpResponse or None
        """
        # A keyed request's span (tracing): its outcome (count() names it), and what the view
        # does (a job's enqueue) as its children.
        with span("idempotency.request", method=request.method):
            return self._guarded(request, policy, view_func, view_args, view_kwargs)

    def _guarded(self, request, policy, view_func, view_args, view_kwargs):
        try:
            return self.keyed(request, policy, view_func, view_args, view_kwargs)
        except CONNECTION_ERRORS as exc:
            # Not a 500: the outcome is defined (see DatabaseUnavailable) and a retry is safe.
            logger.warning(
                "%s %s: database connection failed (%s); answered 503", request.method, request.path, exc
            )
            count("database_unavailable")
            # Drop the dead connection now (Django would at the request's end): the rest of this
            # request (a session saved by its middleware) and the next start on a new one.
            close_old_connections()
            return problem_from_error(DatabaseUnavailable())

    def keyed(self, request, policy, view_func, view_args, view_kwargs):
        """A keyed request: authenticated first, then its key checked, claimed, and the view run
        or its stored answer replayed.

        Parameters
        ----------
        request : HttpRequest
            The request.
        policy : ViewPolicy
            The view's policy (its marker).
        view_func : callable
            The view.
        view_args, view_kwargs
            The view's arguments.

        Returns
        -------
        HttpResponse or None
            None for a request that is not authenticated: the view refuses it, nothing is stored.
        """
        header = idempotency_settings.HEADER
        raw_key = request.headers.get(header)
        # Authentication first: the body of a request that is not authenticated is
        # never read, let alone hashed; the view refuses it as it would without a key.
        scope = resolve_scope(request, view_func)
        if scope is None:
            annotate(outcome="unauthenticated")
            return None  # not authenticated: the view refuses the request, nothing is stored

        def own(answer):
            """An answer the view does not give (so its throttles never see it): counted by
            them, or by IDEMPOTENCY["THROTTLE_RATE"], first (idempotency.throttling)."""
            throttled = throttled_answer(request, view_func, view_args, view_kwargs, scope)
            if throttled is not None:
                count("throttled")
                return throttled
            return answer()

        if raw_key is None:
            count("invalid")
            return own(
                lambda: problem_from_error(
                    IdempotencyKeyMissing(f"This endpoint requires an {header} header.")
                )
            )
        try:
            key = IdemKey.parse(raw_key)
        except InvalidKey as exc:
            count("invalid")
            invalid = IdempotencyKeyInvalid(str(exc))
            return own(lambda: problem_from_error(invalid))

        store = idempotency_settings.STORE()
        fingerprint = request_fingerprint(request)
        aliases = transaction_aliases(view_func, atomic=policy.atomic)
        claim = {
            "scope": scope,
            "key": key.value,
            "fingerprint": fingerprint,
            "ttl_seconds": policy.ttl_seconds or idempotency_settings.TTL,
            "method": request.method,
            "path": request.get_full_path()[:2048],
        }

        def run_view(acquisition):
            count("takeover" if acquisition.takeover else "miss")
            request.idempotency = IdempotencyContext(scope, key, acquisition.lease, acquisition.takeover)
            user = getattr(request, "_idempotency_user", None) or getattr(request, "user", None)
            owner = user if user is not None and user.is_authenticated else None
            with keyed_work(scope, key.value, owner=owner):  # what the view enqueues is keyed from it
                return call_view(view_func, request, view_args, view_kwargs)

        if (using := store.lock_alias(aliases)) is not None:
            # Cached replays first: they need no transaction.
            known = store.cached(scope=scope, key=key.value, fingerprint=fingerprint)
            outcome = known or run_locked(
                store, lambda: store.claim(**claim, using=using), run_view, answer_of, aliases=aliases
            )
            return outcome.result if isinstance(outcome, Ran) else own(lambda: refusal(outcome))

        lease_seconds = policy.lease_seconds or idempotency_settings.LEASE_SECONDS
        acquisition = store.acquire(**claim, lease_seconds=lease_seconds)
        if acquisition.outcome is not Outcome.ACQUIRED:
            return own(lambda: refusal(acquisition))
        assert acquisition.lease is not None
        try:
            ran = run_leased(
                store,
                acquisition.lease,
                lambda: run_view(acquisition),
                answer_of,
                aliases=aliases,
                lease_seconds=lease_seconds,
                on_error=error_verdict,
            )
        except LeaseLost as exc:
            count("lease_lost")
            return problem_from_error(exc)
        if not ran.stored:
            metrics.count("not_stored")
            annotate(stored=False)
            ran.result[STORED_HEADER] = "false"
        return ran.result
