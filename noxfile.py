"""The version matrix (docs/reference/versions.md says which legs passed).

Every leg runs the whole suite in a virtualenv of its own (`.nox/`), with the toolkit's declared
dependencies as pip resolves them for that leg and the test tools of requirements-test.txt:

    nox -s "tests-3.13(django='6.1')"         one Django on one Python, newest releases in range
    nox -s "oldest"                            every dependency at the floor of its declared range
    nox -s "public-3.11" "public-3.13"         library internals off: every adapter's public API
    nox -s "smoke"                             the wheel in a new project, newest releases (Python 3.13)
    make matrix                                all of them, one after the other

`DATABASE_URL` passes through (PostgreSQL legs); arguments after `--` go to pytest. The
interpreters are found on PATH or in pyenv's versions folder (`python_for`).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True  # a leg that cannot run fails, never skips
nox.options.sessions = ["tests", "oldest", "public", "smoke"]

# Django 6 needs Python >= 3.12 (docs/reference/versions.md).
LEGS = [
    ("3.11", "5.2"),
    ("3.12", "5.2"),
    ("3.13", "5.2"),
    ("3.12", "6.0"),
    ("3.13", "6.0"),
    ("3.12", "6.1"),
    ("3.13", "6.1"),
]
NEWEST_DJANGO = "6.1"

# The newest-releases legs turn deprecations into errors, so that an upgrade inside the declared
# ranges never breaks silently: what is deprecated today is gone in the next release.
DEPRECATIONS_ARE_ERRORS = ["-W", "error::DeprecationWarning", "-W", "error::PendingDeprecationWarning"]


def python_for(version: str) -> str:
    """An interpreter for `version` that runs: `pythonX.Y` on PATH, else pyenv's copy (these
    machines have 3.11 as python3, and 3.12 and 3.13 under ~/.pyenv/versions)."""
    for candidate in [
        shutil.which(f"python{version}"),
        *sorted(
            glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")), reverse=True
        ),
    ]:
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return f"python{version}"  # not found: nox fails the leg, naming it


def declared() -> list[str]:
    """The distribution's dependencies and the extras the suite uses (uvicorn, openapi)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *extras["uvicorn"], *extras["openapi"]]


def floors(requirements: list[str]) -> list[str]:
    """`name[extra]>=X,<Y` -> `name==X`: each declared range's oldest release, as constraints
    (pip takes no extras there). Django is pinned by the leg, not here."""
    pins = []
    for requirement in requirements:
        match = re.match(r"\s*([A-Za-z0-9_.-]+)(\[[^]]*\])?\s*>=\s*([^,;\s]+)", requirement)
        if match and match.group(1).lower() != "django":
            pins.append(f"{match.group(1)}=={match.group(3)}")
    return pins


def install(session: nox.Session, django: str, *, constraints: tuple[str, ...] | list[str] = ()) -> None:
    args = ["-r", "requirements-test.txt", f"Django~={django}.0", *declared()]
    if constraints:
        path = Path(session.virtualenv.location) / "constraints.txt"
        path.write_text("\n".join(constraints) + "\n")
        args += ["-c", str(path)]
    session.install("--upgrade", *args)
    session.run("python", "-m", "pip", "freeze", "--exclude-editable", silent=False)


def pytest(session: nox.Session, *extra: str) -> None:
    session.run("python", "-m", "pytest", *extra, *session.posargs, env={"PYTHONDONTWRITEBYTECODE": "1"})


@nox.session(name="tests")
@nox.parametrize(
    "python,django", [(python_for(p), d) for p, d in LEGS], ids=[f"py{p}-django{d}" for p, d in LEGS]
)
def tests(session: nox.Session, django: str) -> None:
    """The whole suite on one Django and Python, the newest releases of every dependency in range."""
    install(session, django)
    pytest(session, *DEPRECATIONS_ARE_ERRORS)


@nox.session(python=python_for("3.11"))
def oldest(session: nox.Session) -> None:
    """The whole suite with every dependency at the floor of its declared range (Django 5.2)."""
    install(session, "5.2", constraints=floors(declared()))
    pytest(session)


@nox.session(name="public")
@nox.parametrize(
    "python,django",
    [(python_for("3.11"), "5.2"), (python_for("3.13"), NEWEST_DJANGO)],
    ids=["py3.11-django5.2", f"py3.13-django{NEWEST_DJANGO}"],
)
def public(session: nox.Session, django: str) -> None:
    """The whole suite with EXACTLY_ONCE_INTERNALS=off: every adapter on the library's public API."""
    install(session, django)
    session.env["EXACTLY_ONCE_INTERNALS"] = "off"
    pytest(session)


@nox.session(python=False)
def smoke(session: nox.Session) -> None:
    """The wheel in a new startproject project (tests/smoke), newest releases in range."""
    # The redis-server the suite uses, found by this (the checkout's) interpreter: Python 3.13's
    # has none of the demo's packages to import config.redis_server with.
    redis_server = subprocess.run(
        [
            sys.executable,
            "-c",
            "from config.redis_server import find_redis_server; print(find_redis_server())",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    session.run(
        "bash",
        "tests/smoke/run_smoke.sh",
        external=True,
        env={"PYTHON": python_for("3.13"), "SMOKE_PINS": "0", "SMOKE_REDIS_SERVER": redis_server},
    )
