"""Django REST framework's internals behind one gate (docs/design/adapters.md): its forced authentication.

Tested range: djangorestframework 3.15.1 to 3.18 (`djangorestframework>=3.15.1,<3.19`). Within it,
and unless `EXACTLY_ONCE_INTERNALS=off`, `hand_over_authentication` takes its fast path;
otherwise its fallback. The path is decided once, when this module is imported (`INTERNALS`).

- `hand_over_authentication` (idempotency.scope.authenticate). A keyed request to a DRF view
  is authenticated by the middleware, with the view's own authenticators, before its key may
  replay anything (docs/howto/idempotent-views.md, Replays and authentication). Internals: the request's `_force_auth_user` and
  `_force_auth_token`, which DRF's Request reads to replace the view's authenticators with the
  result (the way DRF's test client forces authentication). Why: the view does not
  authenticate a second time, one authentication fewer on every first request (with token
  authentication, a database query: 0.14 ms with idempotency.authentication's, 0.44 ms of CPU
  with DRF's own). Fallback: nothing is handed over, and DRF authenticates the request again in
  the view, with the same authenticators and so the same answer: correct, one authentication
  more.

`keep_body_for_csrf_check` is no internal: on DRF before 3.18 it reads a logged-in session's
request body into `request.body` (public) before DRF's CSRF check would take it from the stream
(see below).
"""

from __future__ import annotations

from collections.abc import Callable

import rest_framework
from django.conf import settings
from django.http import RawPostDataException

from exactly_once.internals import internals, release

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


# DRF before 3.18 parses a JSON (or any non-form) body straight from the request's stream when
# its SessionAuthentication's CSRF check reads `request.POST` (Django's CsrfViewMiddleware reads
# POST first), and keeps what it parsed on the Request it authenticated with, which the
# middleware then drops: the fingerprint, and the view, find the stream gone (a 500, found by the
# version matrix's oldest leg in a browser's keyed POST). DRF 3.18 reads `request.body` there,
# which Django keeps. So on older DRF the body of a logged-in session's request is read into
# `request.body` first (within DATA_UPLOAD_MAX_MEMORY_SIZE), as DRF 3.18 would; an anonymous
# request's body stays unread, as SessionAuthentication checks CSRF for a logged-in user only.
BODY_READ_BY_CSRF_CHECK = release(rest_framework.VERSION) < (3, 18)


def keep_body_for_csrf_check(request) -> None:
    """Before DRF authenticates `request` (Django's): keep its body where DRF's CSRF check and
    the fingerprint can both read it."""
    if not BODY_READ_BY_CSRF_CHECK or request.method in ("GET", "HEAD", "OPTIONS", "TRACE"):
        return
    user = getattr(request, "user", None)  # Django's session user (AuthenticationMiddleware)
    if user is None or not user.is_authenticated:
        return
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return
    if limit is not None and length > limit:
        return  # too large for memory: hashed as a stream, which DRF before 3.18 then reads first
    try:
        request.body  # noqa: B018  (read once, kept by Django)
    except RawPostDataException:
        pass  # read already (a parsed form): the fingerprint takes its fields
