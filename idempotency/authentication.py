"""DRF's token authentication with its lookup compiled once.

The middleware authenticates a request before its key may replay anything, so a replay costs at least
an authentication. DRF's `TokenAuthentication` builds and compiles the same ORM query on every
request (`Token.objects.select_related("user").get(key=...)`): measured in-process on
PostgreSQL, 0.44 ms of CPU, of which 0.1 ms is the database round trip; that was half of what
a cached replay cost. This class runs the SQL Django compiled for that query the first time,
with the request's key as its one parameter: 0.14 ms. That reaches into Django's ORM compiler:
it sits in idempotency.adapters.django (`unique_lookup`), whose fallback outside Django's tested
releases is the ORM query itself.

    REST_FRAMEWORK = {"DEFAULT_AUTHENTICATION_CLASSES": [
        "idempotency.authentication.TokenAuthentication",  # instead of rest_framework's
        ...
    ]}

The same token model (DRF's, or the `model` of a subclass), the same `Authorization: Token
<key>` header (`keyword`), the same answers: an unknown key or an inactive user is
`AuthenticationFailed` with DRF's messages. Nothing is cached but the SQL: a deleted token or a
deactivated user is refused on the next request.
"""

from __future__ import annotations

import threading

from django.core.signals import setting_changed
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions

from .adapters.django import UniqueLookup, unique_lookup

_lookups: dict[tuple, UniqueLookup] = {}
_lock = threading.Lock()


def _forget_lookups(*, setting, **kwargs) -> None:
    # Another database or user model (tests' override_settings): compile again.
    if setting in ("DATABASES", "AUTH_USER_MODEL", "DATABASE_ROUTERS"):
        _lookups.clear()


setting_changed.connect(_forget_lookups)


class TokenAuthentication(authentication.TokenAuthentication):
    """rest_framework.authentication.TokenAuthentication, with the token and its user read by
    SQL compiled once per token model and database (`unique_lookup`)."""

    def authenticate_credentials(self, key):
        """The token's user and the token, read by the compiled lookup.

        Parameters
        ----------
        key : str
            The token the request carries.

        Returns
        -------
        tuple of (User, Token)

        Raises
        ------
        rest_framework.exceptions.AuthenticationFailed
            For an unknown token, or a user inactive or deleted.
        """
        model = self.get_model()
        using = model._default_manager.db
        lookup = _lookups.get((model, using))
        if lookup is None:
            with _lock:
                lookup = _lookups.get((model, using)) or unique_lookup(model, "key", ("user",), using)
                _lookups[model, using] = lookup
        token = lookup.get(key)
        if token is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return (token.user, token)
