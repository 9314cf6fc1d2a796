"""The Idempotency-Key value object and helpers that make keys."""

from __future__ import annotations

import hashlib
import json
import re
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


# RFC 8941 parameters after an Item: *( ";" *SP key [ "=" bare-item ] ).
_BARE_ITEM = r'(?:-?[0-9]+(?:\.[0-9]+)?|"(?:[^"\\]|\\["\\])*"|[A-Za-z*][A-Za-z0-9!#$%&\'*+.^_`|~:/-]*|:[A-Za-z0-9+/=]*:|\?[01])'
_PARAMETERS = re.compile(rf"(?:; *[a-z*][a-z0-9_.*-]*(?:={_BARE_ITEM})?)*")


def _sf_string_item(raw: str) -> str:
    """The String of an RFC 8941 Item whose bare item is an sf-string, its parameters dropped:
    DQUOTE *(unescaped / "\\" DQUOTE / "\\" "\\") DQUOTE *(";" parameter)."""
    out = []
    i = 1
    while i < len(raw):
        ch = raw[i]
        if ch == "\\":
            if i + 1 >= len(raw) or raw[i + 1] not in '"\\':
                raise InvalidKey('In a quoted key a backslash may only escape " or \\.')
            out.append(raw[i + 1])
            i += 2
            continue
        if ch == '"':
            break
        out.append(ch)
        i += 1
    else:
        raise InvalidKey("A quoted key must end with a double quote.")
    parameters = raw[i + 1 :]
    if not _PARAMETERS.fullmatch(parameters):
        raise InvalidKey(
            f"After a quoted key only RFC 8941 parameters (;name=value) may follow, not {parameters!r}."
        )
    return "".join(out)


@dataclass(frozen=True, slots=True)
class IdemKey:
    """An Idempotency-Key: a checked string.

    Parameters
    ----------
    value : str
        The key.

    Raises
    ------
    InvalidKey
        For a value that is not a string, or not a valid key.
    """

    value: str

    def __post_init__(self):
        if not isinstance(self.value, str):
            raise InvalidKey(f"A key is a string, not {type(self.value).__name__}.")
        _check(self.value)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, header_value: str) -> IdemKey:
        """The key of a header value.

        Parameters
        ----------
        header_value : str
            A bare token, or an RFC 8941 Item whose String is the key (its parameters, as in
            `"order-1";origin=app`, are ignored).

        Returns
        -------
        IdemKey

        Raises
        ------
        InvalidKey
            For a value that is no valid key.
        """
        raw = header_value.strip(" \t")
        if raw.startswith('"'):
            raw = _sf_string_item(raw)
        return cls(raw)

    @classmethod
    def from_uuid(cls, value: uuid.UUID | None = None) -> IdemKey:
        """A key of a UUID.

        Parameters
        ----------
        value : uuid.UUID, optional
            The UUID; a new random one (uuid4) when omitted.

        Returns
        -------
        IdemKey
        """
        return cls(str(value or uuid.uuid4()))

    @classmethod
    def from_fields(cls, *fields: object, separator: str = ":") -> IdemKey:
        """Business fields joined in order, e.g. ("invoice", 42, "pay") -> "invoice:42:pay".

        Parameters
        ----------
        *fields : object
            The fields, at least one, each as its str().
        separator : str
            What joins them (":").

        Returns
        -------
        IdemKey

        Raises
        ------
        InvalidKey
            Without fields, or when the joined key is not valid.
        """
        if not fields:
            raise InvalidKey("from_fields needs at least one field.")
        return cls(separator.join(str(f) for f in fields))

    @classmethod
    def from_hash(cls, *fields: object) -> IdemKey:
        """SHA-256 of composite fields (canonical JSON), for fields too long or not ASCII.

        Parameters
        ----------
        *fields : object
            The fields, as JSON (what JSON cannot hold, as its str()).

        Returns
        -------
        IdemKey
            The hex digest.
        """
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)
        return cls(hashlib.sha256(canonical.encode()).hexdigest())
