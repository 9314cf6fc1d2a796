"""Fingerprints tell a retry of a request from another request under the same key."""
from __future__ import annotations

import hashlib
import json
from urllib.parse import parse_qsl, urlencode


def canonical_json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def canonical_query(query_string: str) -> str:
    """Parameters sorted by name then value, so ?b=1&a=2 and ?a=2&b=1 are one request."""
    pairs = parse_qsl(query_string, keep_blank_values=True)
    return urlencode(sorted(pairs))


def canonical_body(body: bytes, content_type: str) -> bytes:
    """JSON re-serialised with sorted keys and no spacing; any other body as its raw bytes."""
    if "json" in (content_type or "").lower() and body:
        try:
            return canonical_json(json.loads(body))
        except (ValueError, RecursionError):
            pass  # not JSON after all: the raw bytes still identify the request
    return body


def request_fingerprint(request) -> str:
    digest = hashlib.sha256()
    for part in (
        request.method.encode(),
        request.path.encode("utf-8", "surrogateescape"),
        canonical_query(request.META.get("QUERY_STRING", "")).encode(),
        canonical_body(request.body, request.META.get("CONTENT_TYPE", "")),
    ):
        digest.update(len(part).to_bytes(8, "big"))  # length-prefixed: no two splits collide
        digest.update(part)
    return digest.hexdigest()


def call_fingerprint(args: tuple, kwargs: dict) -> str:
    return hashlib.sha256(canonical_json([list(args), kwargs])).hexdigest()
