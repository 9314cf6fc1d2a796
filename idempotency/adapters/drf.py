"""Django REST framework's internals behind one gate (SPEC §10): its forced authentication.

Tested range: djangorestframework 3.15.1 to 3.18 (`djangorestframework>=3.15.1,<3.19`). Within it,
and unless `EXACTLY_ONCE_INTERNALS=off`, `hand_over_authentication` takes its fast path;
otherwise its fallback. The path is decided once, when this module is imported (`INTERNALS`).

- `hand_over_authentication` (idempotency.scope.authenticate). A keyed request to a DRF view
  is authenticated by the middleware, with the view's own authenticators, before its key may
  replay anything (SPEC §4, §15). Internals: the request's `_force_auth_user` and
  `_force_auth_token`, which DRF's Request reads to replace the view's authenticators with the
  result (the way DRF's test client forces authentication). Why: the view does not
  authenticate a second time, one authentication fewer on every first request (with token
  authentication, a database query: 0.14 ms with idempotency.authentication's, 0.44 ms of CPU
  with DRF's own). Fallback: nothing is handed over, and DRF authenticates the request again in
  the view, with the same authenticators and so the same answer: correct, one authentication
  more.
"""

from __future__ import annotations

from collections.abc import Callable

from . import internals

INTERNALS = internals("drf", "djangorestframework", "3.15.1", "3.19")


def _hand_over_internals(request, user, token) -> None:
    request._force_auth_user = user
    request._force_auth_token = token


def _hand_over_public(request, user, token) -> None:
    pass  # the view's authenticators run again


hand_over_authentication: Callable[[object, object, object], None]
"""hand_over_authentication(request, user, token): let the DRF view that gets `request` (Django's)
take `user` and `token` as its authentication instead of authenticating it again."""

hand_over_authentication = _hand_over_internals if INTERNALS else _hand_over_public
