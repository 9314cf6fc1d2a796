"""What JSON every database and every Python store alike: no NUL character, no deeper nesting
than MAX_JSON_DEPTH. Imported by the services, the decorators, the fingerprints and the event
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
