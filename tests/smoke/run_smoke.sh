#!/usr/bin/env bash
# The installed-toolkit smoke test (`make smoke`, run by .ci/run): the tutorial
# (docs/tutorial.md) run as written. It builds the wheel, installs it into a fresh virtualenv in a
# temporary directory outside the repository with what the tutorial's pip line adds, then runs
# every block of the tutorial in order there (tests/smoke/smoke.py): `django-admin startproject`,
# the settings lines, `startapp shop` and the app's files, the migrations, the tutorial's own Redis,
# run_jobs (the Celery worker, run_router, run_reclaimer, sweep_jobs, run_scheduler) and runserver
# with DEBUG on, the curl commands against them, the worker killed mid-job, Django's tasks (the
# backport's pip line on Django 5.2, run_jobs started again, a task enqueued by a keyed view, read
# from another process, delayed, keyed in code, scheduled), collectstatic, run_jobs and daphne
# with DEBUG off; and checks between the blocks and after them what the tutorial says happens.
# Nothing is imported from the checkout (the page's browser check runs with $PYTHON, which has
# Playwright, and imports nothing of the toolkit either).
#
# Environment:
#   PYTHON              builds the wheel and makes the virtualenv (default: .venv/bin/python)
#   SMOKE_TIMEOUT       seconds for the tutorial and the checks, processes included (default 240)
#   SMOKE_PINS=0        install the dependencies' newest versions in the wheel's ranges instead of
#                       requirements.txt's pins (CI keeps the pins: a new release must not break
#                       an unrelated change)
#   SMOKE_KEEP=1        keep the temporary directory (logs, project, virtualenv)
#   SMOKE_REDIS_SERVER  the redis-server binary (default: the one `make test` uses)
#   SMOKE_BROWSER_PYTHON  an interpreter with Playwright, for the page's browser check (default:
#                       the checkout's .venv/bin/python); without one the check is skipped, and
#                       said so, except on CI (CI set), where it fails
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
# An absolute path (the virtualenv's own, its symlink kept): the steps below run elsewhere.
case "$PYTHON" in
    /*) ;;
    */*) PYTHON="$PWD/$PYTHON" ;;
    *) PYTHON="$(command -v "$PYTHON")" ;;
esac
TIMEOUT="${SMOKE_TIMEOUT:-240}"
TUTORIAL="$REPO/docs/tutorial.md"

say() { echo "smoke: $*"; }
fail() { echo "smoke: FAILED: $*" >&2; exit 1; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/smoke-XXXXXX")"
case "$WORK/" in "$REPO"/*) fail "the temporary directory $WORK is inside the repository";; esac

cleanup() {
    # smoke.py stops what it started and then removes its pid list; a list left behind means it
    # was killed first: end those process groups (its own children, by their ids) here. The list
    # is in the project's folder, which the tutorial's startproject made in $WORK/project.
    local pids
    for pids in "$WORK"/project/*/pids; do
        [ -f "$pids" ] || continue
        while read -r pid; do kill -KILL -- "-$pid" 2>/dev/null || true; done < "$pids"
    done
    if [ "${SMOKE_KEEP:-0}" = 1 ]; then
        say "kept $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

# 1. The wheel, built from a copy of what it ships: an in-tree build would leave build/ and
#    *.egg-info in the checkout. Build isolation brings the setuptools pyproject.toml asks for.
mkdir "$WORK/src" "$WORK/smoke" "$WORK/project"
(cd "$REPO" && tar -c --exclude=__pycache__ --exclude='*.pyc' \
    pyproject.toml README.md $(ls -d LICENSE* 2>/dev/null) exactly_once idempotency eventbus gateway) | tar -x -C "$WORK/src"
say "building the wheel"
timeout 300 "$PYTHON" -m pip wheel --quiet --no-deps -w "$WORK/dist" "$WORK/src" || fail "building the wheel"
WHEEL="$(ls "$WORK"/dist/*.whl)"
cp "$REPO/tests/smoke/smoke.py" "$REPO/tests/smoke/browser.py" "$WORK/smoke/"

# 2. A fresh virtualenv with the wheel, its dependencies and the WebSocket client of the test.
"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
cd "$WORK"  # from here on, nothing runs from the checkout
unset PYTHONPATH DJANGO_SETTINGS_MODULE
"$VPY" "$WORK/smoke/smoke.py" wheel "$WHEEL"
CONSTRAINTS=()
if [ "${SMOKE_PINS:-1}" != 0 ]; then
    # The demo's tested pins, as constraints (pip refuses extras there: `redis[hiredis]` -> `redis`).
    sed -E 's/\[[^]]*\]//' "$REPO/requirements.txt" > "$WORK/constraints.txt"
    # The tutorial's install line's whitenoise: the project's choice, in no requirements file.
    echo "whitenoise==6.12.0" >> "$WORK/constraints.txt"
    CONSTRAINTS=(-c "$WORK/constraints.txt")
fi
# What the tutorial's install line adds to the toolkit (whitenoise), installed with it.
EXTRAS_TEXT="$("$VPY" "$WORK/smoke/smoke.py" requirements "$TUTORIAL")" \
    || fail "reading the tutorial's install line"
EXTRAS=()
[ -z "$EXTRAS_TEXT" ] || mapfile -t EXTRAS <<< "$EXTRAS_TEXT"
say "installing $(basename "$WHEEL") ${EXTRAS[*]} into a fresh virtualenv (${WORK}/venv)"
timeout 600 "$VPY" -m pip install --quiet ${CONSTRAINTS[@]+"${CONSTRAINTS[@]}"} "$WHEEL" \
    ${EXTRAS[@]+"${EXTRAS[@]}"} websockets || fail "installing the wheel"

# 3. The tutorial, block by block, in $WORK/project (its `django-admin startproject mysite` makes
#    the project there). The Redis binary is the one the test suite would use (the system's,
#    refused when known vulnerable).
if [ -z "${SMOKE_REDIS_SERVER:-}" ]; then
    SMOKE_REDIS_SERVER="$(cd "$REPO" && "$PYTHON" -c 'from config.redis_server import find_redis_server; print(find_redis_server())')" \
        || fail "no redis-server: install one (apt-get install redis-server) or set SMOKE_REDIS_SERVER"
fi
# The page's browser check runs with the repository's interpreter, which has Playwright (the
# checkout's .venv; $PYTHON may be another, as in the nox session on the newest releases).
SMOKE_BROWSER_PYTHON="${SMOKE_BROWSER_PYTHON:-$REPO/.venv/bin/python}"
[ -x "$SMOKE_BROWSER_PYTHON" ] || SMOKE_BROWSER_PYTHON="$PYTHON"
export SMOKE_REDIS_SERVER SMOKE_TIMEOUT="$TIMEOUT" SMOKE_BROWSER_PYTHON
cd "$WORK/project"
timeout -k 10 "$((TIMEOUT + 30))" "$VPY" "$WORK/smoke/smoke.py" tutorial "$TUTORIAL" "$WORK/project"
