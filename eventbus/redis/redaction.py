"""Secrets kept out of messages: a Redis or database URL with its password masked, for every
banner, log line and exception that shows one. No import of Django or Redis here:
settings modules and the demo's launcher use it too.

    masked_url("redis://:s3cret@127.0.0.1:6379/0")  ->  "redis://:***@127.0.0.1:6379/0"
"""

from __future__ import annotations

import re

MASK = "***"
# A password passed as a query parameter, as redis-py's from_url reads it (?password=...).
_QUERY_SECRET = re.compile(r"([?&](?:password|passwd|pwd)=)[^&#]*", re.IGNORECASE)


def masked_url(url: str) -> str:
    """`url` with the password of its userinfo (and of a ?password= parameter) replaced by ***.
    A userinfo without a colon is masked whole: a redis+sentinel:// URL reads it as the password.
    Kombu's list of URLs (`sentinel://...;sentinel://...`) is masked URL by URL."""
    return ";".join(_masked_one(part) for part in url.split(";"))


def _masked_one(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _QUERY_SECRET.sub(rf"\1{MASK}", url)
    # The userinfo ends at the last "@" before the query: a password may hold "/" or "@".
    authority_and_path = re.split(r"[?#]", rest, maxsplit=1)[0]
    at = authority_and_path.rfind("@")
    if at >= 0:
        userinfo = rest[:at]
        user, colon, _password = userinfo.partition(":")
        rest = (f"{user}:{MASK}" if colon else MASK) + rest[at:]
    return _QUERY_SECRET.sub(rf"\1{MASK}", f"{scheme}://{rest}")
