"""Whose key is it? Keys live per (tenant, principal), resolved after authentication.

Django middleware runs before DRF authenticates a request, so for a DRF view the resolver
authenticates it here with the view's own authenticators, then hands the result to DRF
(the way DRF's test client forces authentication) so that it is not done twice.
"""
from __future__ import annotations


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
    drf_request = view.initialize_request(request)
    try:
        user = drf_request.user
    except APIException:
        return None
    if user is not None and user.is_authenticated:
        request._force_auth_user = user
        request._force_auth_token = drf_request.auth
    return user


class UserScopeResolver:
    """Default: one tenant, the principal is the user's primary key. Subclass and override
    `tenant()` for multi-tenant projects, `principal()` for other identities."""

    def tenant(self, request) -> str:
        return "-"

    def principal(self, request, user) -> str | None:
        if user is None or not user.is_authenticated:
            return None  # anonymous requests get no idempotency: there is no safe scope
        return str(user.pk)

    def resolve(self, request, view_func) -> str | None:
        principal = self.principal(request, authenticate(request, view_func))
        if principal is None:
            return None
        return f"{self.tenant(request)}:{principal}"
