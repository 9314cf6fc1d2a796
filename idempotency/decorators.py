"""Decorators: `idempotency_key` marks views, `idempotent` wraps service functions (whose keys
are always scoped: to an owner, by a callable, or knowingly GLOBAL)."""

from __future__ import annotations

import enum
import functools
import json
import uuid

from django.core.exceptions import ImproperlyConfigured
from django.db import models

from exactly_once.jsontext import MAX_JSON_DEPTH, json_holds_lone_surrogate, nested_deeper_than

from .conf import idempotency_settings
from .context import keyed_work
from .exceptions import IdempotencyInProgress, IdempotencyKeyMismatch
from .execution import run_leased, transaction_aliases
from .fingerprint import call_fingerprint
from .keys import IdemKey, InvalidKey
from .policy import ATTRIBUTE, REQUIRED, ViewPolicy
from .responses import StoredResponse
from .scope import checked_scope, join_scope
from .stores.base import Outcome


def idempotency_key(mode: str = REQUIRED, **options):
    """Mark a view "required", "optional" or "exempt".

    The view is a function view (put the marker above @api_view, @csrf_exempt...), a view class
    (APIView, ViewSet, Django View), or one handler method or ViewSet action.

    Parameters
    ----------
    mode : str
        "required" (the default), "optional" or "exempt".
    **options
        lease_seconds, ttl_seconds, atomic, methods.

    Returns
    -------
    callable
        The marker, which returns the view it marks.

    Raises
    ------
    django.core.exceptions.ImproperlyConfigured
        When the view is already marked with a different policy.

    Examples
    --------
    ::

        @idempotency_key("required", atomic=True)
        def create(self, request): ...
    """
    policy = ViewPolicy(mode=mode, **options)

    def mark(view):
        # Its own marker only: a class may override the one it inherits. A function wrapped by
        # another decorator carries the inner marker in its __dict__ (functools.wraps copies it).
        existing = vars(view).get(ATTRIBUTE) if hasattr(view, "__dict__") else None
        if existing is not None and existing != policy:
            raise ImproperlyConfigured(
                f"{getattr(view, '__qualname__', view)!r} is marked twice with contradictory idempotency "
                f"policies ({existing.mode!r} and {policy.mode!r}); keep one @idempotency_key marker."
            )
        setattr(view, ATTRIBUTE, policy)
        return view

    return mark


class Scope(enum.Enum):
    GLOBAL = "global"

    def __repr__(self) -> str:
        return f"idempotency.decorators.{self.name}"


# One keyspace per operation, shared by every caller: for keys that are unique by construction
# (a job stage's ctx.key, a UUID the code made), never for keys that come from a user.
GLOBAL = Scope.GLOBAL


def idempotent(
    *, operation: str, scope=None, key="idempotency_key", lease_seconds=None, ttl_seconds=None, atomic=True
):
    """Run a service function once per (scope, key).

    A call again with the same key and arguments returns the first call's result (which must be
    JSON-serialisable) without running it.

    Parameters
    ----------
    operation : str
        The operation's name: its keys are its own.
    scope
        Required: a key from one user must never replay another's result. One of:

        - the name of the keyword argument whose value owns the key: a model instance (a user, a
          tenant...) scopes it as "<app_label>.<model>:<pk>", a str or int as itself; that
          argument is left out of the fingerprint (the scope holds it);
        - a ``callable(*args, **kwargs) -> str``;
        - GLOBAL: one keyspace for all callers, for keys unique by construction.
    key
        The name of the keyword argument that carries the key (it is passed on to the function
        and left out of the fingerprint), or a ``callable(*args, **kwargs) -> key``; by default
        "idempotency_key".
    lease_seconds : int, optional
        How long a call holds the key while it runs (by default the IDEMPOTENCY setting's).
    ttl_seconds : int, optional
        How long the first call's result is kept (by default the IDEMPOTENCY setting's).
    atomic : bool
        Run the function and store its result in one transaction (the default).

    Returns
    -------
    callable
        The decorator.

    Raises
    ------
    IdempotencyKeyMismatch
        For other arguments under a used key.
    IdempotencyInProgress
        While another call holds the key.

    Examples
    --------
    ::

        @idempotent(operation="charge", scope="customer")
        def charge(*, customer, invoice_id, amount, idempotency_key): ...
    """
    _check_scope(scope, operation)

    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if callable(key):
                idem_key, fingerprint_kwargs = key(*args, **kwargs), kwargs
            else:
                if key not in kwargs:
                    raise TypeError(
                        f"{func.__qualname__}() needs the keyword argument {key!r} (the idempotency key)"
                    )
                idem_key = kwargs[key]
                fingerprint_kwargs = {k: v for k, v in kwargs.items() if k != key}
            idem_key = call_key(idem_key, func)
            scope_parts = ["fn", operation]
            if callable(scope):
                scope_parts.append(
                    checked_scope(scope(*args, **kwargs), f"The scope of {func.__qualname__}()")
                )
            elif scope is not GLOBAL:
                scope_parts.append(
                    checked_scope(owner_argument_scope(kwargs, scope, func), f"{func.__qualname__}()")
                )
                fingerprint_kwargs = {k: v for k, v in fingerprint_kwargs.items() if k != scope}
            call_scope = join_scope(*scope_parts)

            store = idempotency_settings.STORE()
            acquisition = store.acquire(
                scope=call_scope,
                key=idem_key.value,
                fingerprint=call_fingerprint(args, fingerprint_kwargs),
                lease_seconds=lease_seconds or idempotency_settings.LEASE_SECONDS,
                ttl_seconds=ttl_seconds or idempotency_settings.TTL,
                method="CALL",
                path=func.__module__ + "." + func.__qualname__,
            )
            if acquisition.outcome is Outcome.REPLAY:
                return json.loads(acquisition.response.body)
            if acquisition.outcome is Outcome.IN_FLIGHT:
                raise IdempotencyInProgress(retry_after=acquisition.retry_after)
            if acquisition.outcome is Outcome.MISMATCH:
                raise IdempotencyKeyMismatch(
                    f"Key {idem_key} of {operation!r} was used with other arguments."
                )
            lease_for = lease_seconds or idempotency_settings.LEASE_SECONDS
            return run_leased(
                store,
                acquisition.lease,
                lambda: _keyed_call(call_scope, idem_key.value, func, args, kwargs),
                _stored_result,
                aliases=transaction_aliases(func, atomic=atomic),
                lease_seconds=lease_for,
            ).result

        return wrapper

    return decorator


def _keyed_call(scope: str, key: str, func, args, kwargs):
    """The call, as keyed work: what it enqueues is keyed from its key (idempotency.context)."""
    with keyed_work(scope, key):
        return func(*args, **kwargs)


def _check_scope(scope, operation: str) -> None:
    if scope is GLOBAL or callable(scope) or (isinstance(scope, str) and scope.isidentifier()):
        return
    given = "no scope" if scope is None else f"scope={scope!r}"
    raise ImproperlyConfigured(
        f"@idempotent(operation={operation!r}) was given {given}. Keys are scoped, so that a key that "
        "comes from one user never replays another user's result. Pass scope='<keyword argument>' "
        "naming the argument that owns the key (a user or other model instance, a str or an int), "
        "scope=<callable(*args, **kwargs) -> str>, or scope=idempotency.decorators.GLOBAL for keys "
        "unique across all callers by construction (a job stage's ctx.key, a UUID made by the code)."
    )


def owner_argument_scope(kwargs: dict, name: str, func) -> str:
    """The scope of the owner passed as the keyword argument `name`: "<app_label>.<model>:<pk>"
    for a model instance, a str or int as itself."""
    if name not in kwargs:
        raise TypeError(f"{func.__qualname__}() needs the keyword argument {name!r} (the owner of its keys)")
    owner = kwargs[name]
    if isinstance(owner, models.Model):
        if owner.pk is None:
            raise ValueError(f"{func.__qualname__}() got an unsaved {name}: its keys need its primary key.")
        return f"{owner._meta.label_lower}:{owner.pk}"
    if isinstance(owner, bool) or not isinstance(owner, (str, int)):
        raise TypeError(
            f"{func.__qualname__}() got {name}={owner!r}: the owner of its keys is a model instance, "
            "a str or an int."
        )
    if isinstance(owner, str) and "\x00" in owner:
        raise ValueError(
            f"{func.__qualname__}() got a {name} with a NUL character: no database column holds it."
        )
    return str(owner)


def call_key(value, func) -> IdemKey:
    """A call's key: an IdemKey, or a str, int or UUID made into one. A missing key (None) is
    refused: as the string "None" it would make unrelated calls share one key."""
    if isinstance(value, IdemKey):
        return value
    if value is None:
        raise InvalidKey(f"{func.__qualname__}() was called without an idempotency key (it is None).")
    if isinstance(value, bool) or not isinstance(value, (str, int, uuid.UUID)):
        raise InvalidKey(
            f"{func.__qualname__}() got an idempotency key of type {type(value).__name__}; "
            "pass a str, int, UUID or IdemKey."
        )
    return IdemKey(str(value))


def _stored_result(result) -> StoredResponse:
    try:
        text = json.dumps(result)
    except (TypeError, ValueError, RecursionError) as exc:  # ValueError: a cycle
        raise TypeError(
            f"An @idempotent function must return JSON-serialisable data, not nested too deep: {exc}"
        ) from None
    if nested_deeper_than(result, text):
        raise TypeError(
            f"An @idempotent function must return JSON-serialisable data, not nested too deep "
            f"(more than {MAX_JSON_DEPTH} levels)."
        )
    if json_holds_lone_surrogate(text):
        raise TypeError(
            "An @idempotent function must return JSON-serialisable data: its result holds a lone "
            "surrogate (\\ud800 to \\udfff), which is not Unicode text."
        )
    body = text.encode()
    return StoredResponse(200, (("Content-Type", "application/json"),), body)
