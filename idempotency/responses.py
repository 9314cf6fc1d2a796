"""Which responses are stored, what of them is kept, and how a replay is rebuilt."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
from django.http import HttpResponse
from django.http.multipartparser import MultiPartParserError

from .conf import idempotency_settings

REPLAYED_HEADER = "Idempotent-Replayed"
# On an answer that could not be stored (its effects stand): "false". A retry would run again.
STORED_HEADER = "Idempotency-Stored"


@dataclass(frozen=True, slots=True)
class StoredResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def is_storable(response) -> bool:
    """2xx, 3xx (a POST-redirect-GET form replays its redirect, Location included) and 4xx
    that are final answers (docs/reference/idempotency.md). Never 5xx, 1xx or a streamed body."""
    if getattr(response, "streaming", False):
        return False
    status = response.status_code
    if 200 <= status < 400:
        return True
    return 400 <= status < 500 and status not in idempotency_settings.NOT_STORED_STATUSES


def is_refusal(response) -> bool:
    """A refusal that comes before the view's work (validation, authentication, throttling...):
    it has no effects to protect, so its key is freed for a corrected request."""
    return (
        not getattr(response, "streaming", False)
        and response.status_code in idempotency_settings.NOT_STORED_STATUSES
    )


def refused_status(exc: BaseException) -> int | None:
    """The status Django answers an exception with when it is a refusal (its handler's 400 and
    403), else None."""
    if isinstance(exc, PermissionDenied):
        return 403
    if isinstance(exc, (BadRequest, SuspiciousOperation, MultiPartParserError)):
        return 400
    return None


def capture(response) -> StoredResponse:
    allowed = {name.lower() for name in idempotency_settings.REPLAYED_HEADERS}
    # A NUL in a field value is replaced by a space, as RFC 9110 (5.5) lets a recipient do:
    # Django lets a view set one, and PostgreSQL's jsonb cannot hold it (the body, bytea, can).
    headers = tuple(
        (name, value.replace("\x00", " ")) for name, value in response.items() if name.lower() in allowed
    )
    return StoredResponse(response.status_code, headers, bytes(response.content))


def replay(stored: StoredResponse) -> HttpResponse:
    response = HttpResponse(stored.body, status=stored.status)
    del response["Content-Type"]  # only what the original carried
    for name, value in stored.headers:
        response[name] = value
    response[REPLAYED_HEADER] = "true"
    return response
