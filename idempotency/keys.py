"""The Idempotency-Key value object and helpers that make keys."""
from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass

MAX_LENGTH = 255


class InvalidKey(ValueError):
    """A key that is empty, too long, or not printable ASCII."""


def _check(value: str) -> str:
    if not value:
        raise InvalidKey("The key is empty.")
    if len(value) > MAX_LENGTH:
        raise InvalidKey(f"The key is {len(value)} characters long; at most {MAX_LENGTH} are allowed.")
    bad = next((ch for ch in value if not " " <= ch <= "~"), None)
    if bad is not None:
        raise InvalidKey(f"The key holds {bad!r}; only printable ASCII (0x20-0x7E) is allowed.")
    return value


def _unquote_sf_string(raw: str) -> str:
    """An RFC 8941 sf-string: DQUOTE *(unescaped / "\\" DQUOTE / "\\" "\\") DQUOTE."""
    out = []
    i, end = 1, len(raw) - 1
    if len(raw) < 2 or not raw.endswith('"'):
        raise InvalidKey("A quoted key must end with a double quote.")
    while i < end:
        ch = raw[i]
        if ch == "\\":
            if i + 1 >= end or raw[i + 1] not in '"\\':
                raise InvalidKey('In a quoted key a backslash may only escape " or \\.')
            out.append(raw[i + 1])
            i += 2
            continue
        if ch == '"':
            raise InvalidKey("A quoted key holds an unescaped double quote.")
        out.append(ch)
        i += 1
    return "".join(out)


@dataclass(frozen=True, slots=True)
class IdemKey:
    value: str

    def __post_init__(self):
        if not isinstance(self.value, str):
            raise InvalidKey(f"A key is a string, not {type(self.value).__name__}.")
        _check(self.value)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, header_value: str) -> "IdemKey":
        """A header value: a bare token, or an RFC 8941 quoted string that is unquoted."""
        raw = header_value.strip(" \t")
        if raw.startswith('"'):
            raw = _unquote_sf_string(raw)
        return cls(raw)

    @classmethod
    def from_uuid(cls, value: uuid.UUID | None = None) -> "IdemKey":
        return cls(str(value or uuid.uuid4()))

    @classmethod
    def from_fields(cls, *fields: object, separator: str = ":") -> "IdemKey":
        """Business fields joined in order, e.g. ("invoice", 42, "pay") -> "invoice:42:pay"."""
        if not fields:
            raise InvalidKey("from_fields needs at least one field.")
        return cls(separator.join(str(f) for f in fields))

    @classmethod
    def from_hash(cls, *fields: object) -> "IdemKey":
        """SHA-256 of composite fields (canonical JSON), for fields too long or not ASCII."""
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)
        return cls(hashlib.sha256(canonical.encode()).hexdigest())
