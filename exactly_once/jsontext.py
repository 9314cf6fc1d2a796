"""What JSON every database and every Python store alike: no NUL character, no lone surrogate,
no deeper nesting than MAX_JSON_DEPTH. Imported by the services, the decorators, the fingerprints and the event
bus's stage records; it imports nothing of Django's, so any module may use it."""

from __future__ import annotations

import re

# A NUL as json.dumps writes it: \u0000 after an even number of backslashes. After an odd
# number it is the text backslash-u0000 (six plain characters, which every database holds).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def json_holds_nul(text: str) -> bool:
    """Whether JSON text (as json.dumps writes it) holds a NUL character: PostgreSQL's jsonb and
    text refuse one, SQLite stores it, so nothing that holds one is stored anywhere."""
    return "\\u0000" in text and _NUL_ESCAPE.search(text) is not None


# A UTF-16 surrogate, as json.dumps writes it (an escape, ensure_ascii) or as a character
# (ensure_ascii=False), and an escaped pair (one character beyond the BMP). Lowercase or
# uppercase hex: a client's JSON may spell either.
_SURROGATE_ESCAPE = re.compile(
    r"(?<!\\)(?:\\\\)*(\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2})"
)
_SURROGATE_CHARACTER = re.compile("[\ud800-\udfff]")


def json_holds_lone_surrogate(text: str) -> bool:
    """Whether JSON text holds a lone UTF-16 surrogate (`"\\ud800"`), a code point that is no
    Unicode text: it parses into a str that no UTF-8 encoder takes, so a row holding one is
    stored (SQLite) or refused (PostgreSQL's jsonb), then every page that shows it fails."""
    if _SURROGATE_CHARACTER.search(text) is not None:
        return True
    if "\\u" not in text:
        return False
    return any(len(match.group(1)) == 6 for match in _SURROGATE_ESCAPE.finditer(text))


def text_is_unicode(text: str) -> bool:
    """Whether a str is Unicode text: no lone surrogate, so that UTF-8 can encode it."""
    return _SURROGATE_CHARACTER.search(text) is None


def value_is_unicode(value) -> bool:
    """Whether every str in a parsed JSON value (its keys too) is Unicode text. Walked with a
    stack, not recursion: the value may be as deep as the parser allowed."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not text_is_unicode(item):
                return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def json_unstorable(text: str) -> str | None:
    """What in JSON text (as json.dumps writes it) no database stores alike, or None: "a NUL
    character (\\u0000)" or "a lone surrogate (\\ud800 to \\udfff, not Unicode text)"."""
    if json_holds_nul(text):
        return "a NUL character (\\u0000)"
    if json_holds_lone_surrogate(text):
        return "a lone surrogate (\\ud800 to \\udfff: not Unicode text)"
    return None


# JSON deeper than this is refused before it is stored or fingerprinted. Python's json recursed
# once per level up to 3.11 (RecursionError at about 1,000 levels); 3.12 and later go far deeper
# (5,000 levels parse): one explicit limit gives one answer on every Python and database.
MAX_JSON_DEPTH = 500


def nested_deeper_than(value, text: str | bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `value` (lists and dicts; `text` its JSON form, which json.dumps already
    wrote, so it holds no cycle) nests deeper than `limit`. Walked with a stack, not recursion,
    and only when the text is long enough to hold that many brackets: free for most values."""
    if len(text) <= 2 * limit:
        return False
    stack = [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list, tuple)):
            if depth > limit:
                return True
            stack.extend((item, depth + 1) for item in (value.values() if isinstance(value, dict) else value))
    return False
