"""Fingerprints tell a retry of a request from another request under the same key.

A request's body is fingerprinted once the request is authenticated and its key is valid
(docs/howto/idempotent-views.md: an unauthenticated client cannot make the server hash a body by adding a key), in the
middleware's process_view. The body stays readable for the view:
- a body within DATA_UPLOAD_MAX_MEMORY_SIZE is read as `request.body` (Django keeps it);
- a larger one is hashed as a stream, in chunks, and left on a spooled temporary file that
  the view reads as if nobody had (memory stays bounded, uploaded files included);
- a multipart form that an earlier check parsed already (the CSRF check, DRF's session
  authentication) is fingerprinted from its parsed fields and files.
What was read of the body, and the stream, are Django's request internals: they sit in
idempotency.adapters.django (`request_body`), whose fallback on Django's public API cannot
rewind a stream, so it parses a large multipart form instead and refuses another large body
as `request.body` does (that module says the trade).

Canonical forms, so that a retry that means the same matches: JSON bodies held in memory are
re-serialised with sorted keys; a multipart body's random boundary is replaced by a constant
(a client resending a form builds a new one). Other bodies count by their raw bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from urllib.parse import parse_qsl, urlencode

from django.conf import settings

from exactly_once.jsontext import nested_deeper_than

from .adapters.django import Body, request_body

CHUNK = 64 * 1024
# Bodies above this are hashed as a stream when DATA_UPLOAD_MAX_MEMORY_SIZE is None (no limit).
DEFAULT_MEMORY_LIMIT = 2_621_440
_BOUNDARY = re.compile(r'boundary="?([^";,]+)"?', re.IGNORECASE)
_CANONICAL_BOUNDARY = b"--idempotency-boundary"


class BodyUnavailable(RuntimeError):
    """The body was consumed before it could be fingerprinted, and cannot be rebuilt."""


def canonical_json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def canonical_query(query_string: str) -> str:
    """Parameters sorted by name then value, so ?b=1&a=2 and ?a=2&b=1 are one request."""
    pairs = parse_qsl(query_string, keep_blank_values=True)
    return urlencode(sorted(pairs))


def multipart_delimiter(content_type: str) -> bytes | None:
    if not (content_type or "").lower().startswith("multipart/"):
        return None
    match = _BOUNDARY.search(content_type)
    return b"--" + match.group(1).encode("latin-1", "replace") if match else None


def _replaced(chunks: Iterable[bytes], old: bytes, new: bytes) -> Iterator[bytes]:
    """The chunks with every `old` replaced by `new`, also where `old` spans two chunks."""
    carry = b""
    for chunk in chunks:
        data = (carry + chunk).replace(old, new)
        # Keep back what could be the start of `old`, to be completed by the next chunk.
        keep = len(old) - 1
        carry, data = (data[-keep:], data[:-keep]) if keep and len(data) > keep else (data, b"")
        if data:
            yield data
    if carry:
        yield carry


def canonical_chunks(chunks: Iterable[bytes], content_type: str) -> Iterable[bytes]:
    delimiter = multipart_delimiter(content_type)
    return _replaced(chunks, delimiter, _CANONICAL_BOUNDARY) if delimiter else chunks


def canonical_body(body: bytes, content_type: str) -> bytes:
    """JSON re-serialised with sorted keys and no spacing; multipart with a constant
    boundary; any other body as its raw bytes."""
    if "json" in (content_type or "").lower() and body:
        try:
            return canonical_json(json.loads(body))
        except (ValueError, RecursionError):
            pass  # not JSON after all: the raw bytes still identify the request
    return b"".join(canonical_chunks([body], content_type))


def _memory_limit() -> int:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return DEFAULT_MEMORY_LIMIT if limit is None else limit


def _file_digest(upload) -> str:
    digest = hashlib.sha256()
    upload.seek(0)
    while chunk := upload.read(CHUNK):
        digest.update(chunk)
    upload.seek(0)
    return digest.hexdigest()


def _parsed_form(request) -> Iterator[bytes]:
    """A form parsed before (by code before the middleware, or on the request adapter's fallback
    by the fingerprint itself; its stream is gone): fields, then files."""
    yield canonical_json(sorted((k, v) for k in request.POST for v in request.POST.getlist(k)))
    for name in sorted(request.FILES):
        for upload in request.FILES.getlist(name):
            yield canonical_json([name, upload.name, upload.content_type, _file_digest(upload)])


def body_digest(request) -> bytes:
    """The SHA-256 of the request's canonical body, leaving the body readable for the view."""
    content_type = request.META.get("CONTENT_TYPE", "")
    digest = hashlib.sha256()
    body = request_body(request, _memory_limit, CHUNK)
    if isinstance(body, bytes):
        digest.update(canonical_body(body, content_type))
    elif body is Body.FORM:
        for part in _parsed_form(request):
            digest.update(len(part).to_bytes(8, "big") + part)
    elif body is Body.GONE:
        raise BodyUnavailable(
            "The request body was read as a stream before the idempotency middleware could "
            "fingerprint it: code that reads it must run after IdempotencyMiddleware.process_view "
            "(request.body and request.POST are fine)."
        )
    else:
        # Too large for memory: hashed as it is read, and left unread for the view.
        for part in canonical_chunks(body, content_type):
            digest.update(part)
    return digest.digest()


def request_fingerprint(request) -> str:
    """method, route, canonical query and the body's digest (`body_digest`)."""
    digest = hashlib.sha256()
    for part in (
        request.method.encode(),
        request.path.encode("utf-8", "surrogateescape"),
        canonical_query(request.META.get("QUERY_STRING", "")).encode(),
        body_digest(request),
    ):
        digest.update(len(part).to_bytes(8, "big"))  # length-prefixed: no two splits collide
        digest.update(part)
    return digest.hexdigest()


def call_fingerprint(args: tuple, kwargs: dict) -> str:
    arguments = [list(args), kwargs]
    try:
        text = canonical_json(arguments)
    except RecursionError:
        text = None
    # A clear error instead: arguments have no raw bytes to fall back on.
    if text is None or nested_deeper_than(arguments, text):
        raise ValueError("The arguments are nested too deep to fingerprint.")
    return hashlib.sha256(text).hexdigest()
