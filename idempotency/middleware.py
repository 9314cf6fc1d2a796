"""The Idempotency-Key middleware: the request/response edge only; storage is the store's.

It sits last in MIDDLEWARE and, for a covered request that carries a key, calls the view
itself, so that the view's transaction can also store its answer (see execution.py).
"""
from __future__ import annotations

from asgiref.sync import async_to_sync, iscoroutinefunction

from . import metrics
from .conf import idempotency_settings
from .exceptions import IdempotencyInProgress, IdempotencyKeyMismatch, LeaseLost
from .execution import IdempotencyContext, run_leased, transaction_aliases
from .fingerprint import request_fingerprint
from .keys import IdemKey, InvalidKey
from .policy import OPTIONAL, policy_for
from .problems import problem, problem_from_error
from .responses import capture, is_storable, replay
from .stores.base import Outcome


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


def storable_response(response):
    return capture(response) if is_storable(response) else None


class IdempotencyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        policy = policy_for(view_func, request.method)
        if policy is None:
            return None
        header = idempotency_settings.HEADER
        raw_key = request.headers.get(header)
        if raw_key is None and policy.mode == OPTIONAL:
            return None
        scope = idempotency_settings.SCOPE_RESOLVER().resolve(request, view_func)
        if scope is None:
            return None  # not authenticated: the view refuses the request, nothing is stored
        if raw_key is None:
            metrics.count("invalid")
            return problem(400, f"This endpoint requires an {header} header.",
                           title=f"{header} missing", type="urn:problem:idempotency-key-missing")
        try:
            key = IdemKey.parse(raw_key)
        except InvalidKey as exc:
            metrics.count("invalid")
            return problem(400, str(exc), title=f"Invalid {header}", type="urn:problem:idempotency-key-invalid")

        store = idempotency_settings.STORE()
        acquisition = store.acquire(
            scope=scope,
            key=key.value,
            fingerprint=request_fingerprint(request),
            lease_seconds=policy.lease_seconds or idempotency_settings.LEASE_SECONDS,
            ttl_seconds=policy.ttl_seconds or idempotency_settings.TTL,
            method=request.method,
            path=request.get_full_path()[:2048],
        )
        if acquisition.outcome is Outcome.REPLAY:
            metrics.count("replay")
            return replay(acquisition.response)
        if acquisition.outcome is Outcome.IN_FLIGHT:
            metrics.count("conflict")
            return problem_from_error(IdempotencyInProgress(retry_after=acquisition.retry_after))
        if acquisition.outcome is Outcome.MISMATCH:
            metrics.count("mismatch")
            return problem_from_error(IdempotencyKeyMismatch(
                f"This {header} was used for a request with another method, path, query string or body."
            ))

        metrics.count("takeover" if acquisition.takeover else "miss")
        request.idempotency = IdempotencyContext(scope, key, acquisition.lease, acquisition.takeover)
        try:
            return run_leased(
                store,
                acquisition.lease,
                lambda: call_view(view_func, request, view_args, view_kwargs),
                storable_response,
                aliases=transaction_aliases(view_func, atomic=policy.atomic),
            )
        except LeaseLost as exc:
            metrics.count("lease_lost")
            return problem_from_error(exc)
