"""Which responses are stored, what of them is kept, and how a replay is rebuilt."""
from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpResponse

from .conf import idempotency_settings

REPLAYED_HEADER = "Idempotent-Replayed"


@dataclass(frozen=True, slots=True)
class StoredResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def is_storable(response) -> bool:
    """2xx, and 4xx that are final answers. Never 5xx, 1xx/3xx or a streamed body."""
    if getattr(response, "streaming", False):
        return False
    status = response.status_code
    if 200 <= status < 300:
        return True
    return 400 <= status < 500 and status not in idempotency_settings.NOT_STORED_STATUSES


def capture(response) -> StoredResponse:
    allowed = {name.lower() for name in idempotency_settings.REPLAYED_HEADERS}
    headers = tuple((name, value) for name, value in response.items() if name.lower() in allowed)
    return StoredResponse(response.status_code, headers, bytes(response.content))


def replay(stored: StoredResponse) -> HttpResponse:
    response = HttpResponse(stored.body, status=stored.status)
    del response["Content-Type"]  # only what the original carried
    for name, value in stored.headers:
        response[name] = value
    response[REPLAYED_HEADER] = "true"
    return response
