"""Files that hold secrets (the demo password, the private Redis's config with its password) and
the folders they live in (RUN_DIR, RUN_DIR/redis): readable by their owner only from the first
byte on, never written and chmodded after.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def private_dir(path: str | os.PathLike) -> Path:
    """`path` created if missing, with its parents; mode 0700 whether it was there or not
    (a folder an earlier version made 0755 is closed too)."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def write_private_file(path: str | os.PathLike, text: str) -> Path:
    """`text` in `path`, mode 0600, replaced atomically: written to a temporary file of mode 0600
    in the same folder (mkstemp creates it so), then renamed over `path`. A reader sees the old
    file or the new one, never a half-written or world-readable one."""
    path = Path(path)
    private_dir(path.parent)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
