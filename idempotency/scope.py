"""Whose key is it? Keys live per (tenant, principal), resolved after authentication.

Django middleware runs before DRF authenticates a request, so for a DRF view the resolver
authenticates it here with the view's own authenticators, then hands the result to DRF
(the way DRF's test client forces authentication) so that it is not done twice: DRF's
internals, in idempotency.adapters.drf (`hand_over_authentication`; on its fallback the view
authenticates the request again).
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from .adapters.drf import hand_over_authentication, keep_body_for_csrf_check
from .conf import idempotency_settings


def drf_view_class(view_func):
    cls = getattr(view_func, "cls", None)
    if cls is None:
        return None
    from rest_framework.views import APIView

    return cls if isinstance(cls, type) and issubclass(cls, APIView) else None


def authenticate(request, view_func):
    """The request's user as the view will see it, or None when authentication fails
    (the view then refuses the request itself, and nothing is stored)."""
    cls = drf_view_class(view_func)
    if cls is None:
        return getattr(request, "user", None)
    from rest_framework.exceptions import APIException

    # Build the view as its as_view() would, so per-view and per-action authenticators apply.
    view = cls(**getattr(view_func, "initkwargs", {}))
    view.args, view.kwargs, view.request = (), {}, request
    if getattr(view_func, "actions", None) is not None:
        view.action_map = view_func.actions
    keep_body_for_csrf_check(request)
    drf_request = view.initialize_request(request)
    session_user = request.__dict__.get("user")  # AuthenticationMiddleware's, if any
    try:
        user = drf_request.user
    except APIException:
        # DRF's failed authentication set Django's request.user to AnonymousUser. Put the
        # session's user back, so that the view's own authentication fails alike: DRF's
        # SessionAuthentication then refuses a logged-in user's POST without its CSRF token
        # (403 "CSRF Failed"), instead of finding no user at all (401 "not provided").
        if session_user is not None:
            request.user = session_user
        return None
    if user is not None and user.is_authenticated:
        hand_over_authentication(request, user, drf_request.auth)
        # Who the keyed work acts for (idempotency.context's owner): Django's request.user is
        # not the DRF view's user (token authentication) until the view runs.
        request._idempotency_user = user
    return user


class UserScopeResolver:
    """Default: one tenant, the principal is the user's primary key. Subclass and override
    `tenant()` for multi-tenant projects, `principal()` for other identities."""

    def tenant(self, request) -> str:
        """The request's tenant: "-", the one tenant.

        Parameters
        ----------
        request : HttpRequest
            The request.

        Returns
        -------
        str
            A non-empty tenant.
        """
        return "-"

    def principal(self, request, user) -> str | None:
        """Who the request acts for: the user's primary key.

        Parameters
        ----------
        request : HttpRequest
            The request.
        user : User or None
            The authenticated user, or None.

        Returns
        -------
        str or None
            None for an anonymous request: it gets no idempotency (there is no safe scope).
        """
        if user is None or not user.is_authenticated:
            return None  # anonymous requests get no idempotency: there is no safe scope
        return str(user.pk)

    def resolve(self, request, view_func) -> str | None:
        """The request's scope: its tenant and its principal, joined.

        Parameters
        ----------
        request : HttpRequest
            The request, authenticated as `view_func` would authenticate it.
        view_func : callable
            The view the request is routed to.

        Returns
        -------
        str or None
            None: no idempotency (anonymous).

        Raises
        ------
        django.core.exceptions.ImproperlyConfigured
            When the tenant or the principal is empty: every request of that tenant would share
            one keyspace.
        """
        principal = self.principal(request, authenticate(request, view_func))
        if principal is None:
            return None
        tenant = self.tenant(request)
        if not tenant or not principal:
            raise ImproperlyConfigured(
                f"{type(self).__qualname__} resolved tenant {tenant!r} and principal {principal!r}: both "
                "must be non-empty, or every request of that tenant would share one keyspace."
            )
        return join_scope(tenant, principal)


def join_scope(*parts: str) -> str:
    """Parts joined by ":", each with its own "%" and ":" escaped, so that no two lists of parts
    give one scope (tenant "a:b" with principal "c" is not tenant "a" with principal "b:c").
    Parts without either character (a pk, "-") are unchanged."""
    return ":".join(part.replace("%", "%25").replace(":", "%3A") for part in parts)


def checked_scope(scope, source) -> str:
    """A scope as a resolver returned it, refused when empty: an empty scope is one keyspace
    shared by every caller, where one user's key would replay another's answer."""
    if not isinstance(scope, str) or not scope.strip() or "\x00" in scope:
        raise ImproperlyConfigured(
            f"{source} returned the scope {scope!r}: a scope must be a non-empty string, without NUL "
            "characters, that names one principal (a resolver returns None to leave a request "
            "without idempotency)."
        )
    return scope


def resolve_scope(request, view_func) -> str | None:
    """The request's scope by the configured resolver; None: no idempotency (anonymous)."""
    resolver = idempotency_settings.SCOPE_RESOLVER()
    scope = resolver.resolve(request, view_func)
    return None if scope is None else checked_scope(scope, type(resolver).__qualname__)
