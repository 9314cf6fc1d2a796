"""The cached store's entries: a stored answer as signed JSON bytes, never a pickle.

Whoever can write to Redis must not run code in the web process: django-redis's
default serializer (and Django's own Redis and memcached backends) unpickle what they read, so
an entry written there by anyone else would run on the next replay. An entry is

    <HMAC-SHA256 hex> "." <JSON: fingerprint, expires, status, headers, base64 body>

signed for the Redis key it lives under (a genuine entry copied under another user's key is
refused like a forged one) by HMAC-SHA256, keyed as Django's `salted_hmac` keys it: from a salt
of this module's own and SECRET_KEY. Entries signed with a key in SECRET_KEY_FALLBACKS are
accepted, so that a key rotation does not turn every cached answer into a miss. Reading one
costs one HMAC and a JSON parse.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
from dataclasses import dataclass

from django.conf import settings
from django.utils.encoding import force_bytes

from ..responses import StoredResponse

SALT = "idempotency.stores.entries"


class BadEntry(ValueError):
    """An entry this server did not write for this key: forged, corrupt, moved or unsigned."""


@dataclass(frozen=True, slots=True)
class Entry:
    fingerprint: str
    expires: float  # the record's expiry, a POSIX timestamp
    response: StoredResponse


@functools.lru_cache(maxsize=8)
def _hmac_key(secret: str | bytes) -> bytes:
    # django.utils.crypto.salted_hmac's key derivation, done once per secret instead of on every
    # replay (this is the replay path: one GET, one HMAC).
    return hashlib.sha256(SALT.encode() + force_bytes(secret)).digest()


def _signature(name: str, payload: bytes, secret) -> bytes:
    message = name.encode() + b"\0" + payload
    return hmac.new(_hmac_key(secret), message, hashlib.sha256).hexdigest().encode()


def dumps(name: str, entry: Entry) -> bytes:
    """The entry as stored under the Redis key `name`."""
    response = entry.response
    payload = json.dumps(
        {
            "fingerprint": entry.fingerprint,
            "expires": entry.expires,
            "status": response.status,
            "headers": [list(h) for h in response.headers],
            "body": base64.b64encode(response.body).decode("ascii"),
        },
        separators=(",", ":"),
    ).encode()
    return _signature(name, payload, settings.SECRET_KEY) + b"." + payload


def loads(name: str, raw: bytes) -> Entry:
    """The entry read from the Redis key `name`; BadEntry unless this server signed it for
    that key. Nothing in it is evaluated: it is JSON, checked before it is parsed."""
    signature, dot, payload = raw.partition(b".")
    if not dot:
        raise BadEntry("not a signed entry")
    secrets = (settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ()))
    if not any(hmac.compare_digest(signature, _signature(name, payload, s)) for s in secrets):
        raise BadEntry("bad signature")
    try:
        data = json.loads(payload)
        headers = tuple((str(field), str(value)) for field, value in data["headers"])
        response = StoredResponse(int(data["status"]), headers, base64.b64decode(data["body"], validate=True))
        return Entry(str(data["fingerprint"]), float(data["expires"]), response)
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        # Signed by us yet unreadable: written by another version of this module.
        raise BadEntry(f"unreadable signed entry ({type(exc).__name__})") from None
