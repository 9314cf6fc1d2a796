"""The installed-toolkit smoke test (SPEC §10), driven by tests/smoke/run_smoke.sh.

Runs with the Python of a fresh virtualenv outside the repository, into which only the built
wheel (and `websockets`, for the WebSocket client) was installed, so every import of
`idempotency`, `eventbus` or `gateway` comes from the wheel. Subcommands:

    smoke.py wheel WHEEL              the wheel ships the apps' data files, and no demo code
    smoke.py requirements README      print what the README's pip line installs besides the
                                      toolkit, one per line (run_smoke.sh installs those too)
    smoke.py project README DIR       write the README's settings lines into the startproject
                                      project in DIR, then add the project's own app `shop`
    smoke.py run DIR                  start Redis, a Celery worker, run_router and daphne for
                                      that project, and check it end to end

`run` runs the README's commands: the production ones (collectstatic, daphne with DEBUG off)
with the worker, the router and the reclaimer, then the development server (runserver with
DEBUG on). It checks that a keyed POST to the project's own DRF view runs once and its retry
replays; that a job of the project's own type runs through the worker and the router to a
WebSocket client, which gets each of its events once, in seq order, ending with the final one;
that operating jobs works (a stage retried after an outside API's 503, a long stage
cancelled through the API ending CANCELLED, a failed job retried through the API completing
without running its finished stages again), and that the admin shows a job's stages and
the dead letters; and, under both servers, that every script, style sheet and icon the page, its login page and
the admin's login page reference answers 200 with its content type, and the job's socket
replays its events. It stops every process it started, whatever happens, and exits 1 with the
reason and the processes' logs on failure.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
import zipfile
from html.parser import HTMLParser
from pathlib import Path

PROJECT = "smokeproj"
HERE = Path(__file__).resolve().parent
# The README's blocks CI runs: `<!-- smoke: append|write mysite/<file> -->` just above a fence
# (or shop/<file>: the project's own app, which the README's examples call `shop`).
README_BLOCK = re.compile(r"<!-- smoke: (append|write) (\S+) -->\s*\n```[a-z]*\n(.*?)\n```", re.DOTALL)
README_FILES = {"settings.py", "urls.py", "asgi.py", "celery.py", "__init__.py"}
README_SHOP_FILES = {"views.py"}
# Its commands: `<!-- smoke: install -->` (the pip line) and `<!-- smoke: run development|production -->`,
# each run block's lines keyed by what they start (a manage.py command's name, else the program).
README_COMMANDS = re.compile(r"<!-- smoke: (install|run \w+) -->\s*\n```sh\n(.*?)\n```", re.DOTALL)
README_RUNS = {
    "run development": {"migrate", "runserver", "celery", "run_router", "run_reclaimer"},
    "run production": {"collectstatic", "daphne"},
}
CHECKOUT = "/path/to/this/checkout"  # the README's placeholder for what run_smoke.sh built the wheel from
# The Greet job of shop/jobs.py: (stage, seq) of each event, as the toolkit numbers them.
EXPECTED_EVENTS = [("prepare", 10), ("write", 20), ("write", 21), ("write", 22), ("done", 51)]


class SmokeFailure(Exception):
    pass


def check(condition, message: str) -> None:
    if not condition:
        raise SmokeFailure(message)


def say(message: str) -> None:
    print(f"smoke: {message}", flush=True)


# -- wheel ---------------------------------------------------------------------------------


def check_wheel(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    check(
        tops == {"idempotency", "eventbus", "gateway"}, f"the wheel's top-level packages are {sorted(tops)}"
    )
    for required in (
        "eventbus/lua/publish.lua",
        "eventbus/lua/route.lua",
        "eventbus/lua/_prelude.lua",
        "eventbus/migrations/0001_initial.py",
        "idempotency/migrations/0001_initial.py",
        "eventbus/management/commands/run_router.py",
        "gateway/static/gateway/app.js",
        "gateway/static/gateway/jobstream.js",
        "gateway/templates/gateway/index.html",
        "gateway/templates/gateway/login.html",
        "eventbus/templates/admin/eventbus/deadletter/change_list.html",
    ):
        check(required in names, f"the wheel lacks {required}")
    check(not any("__pycache__" in name for name in names), "the wheel ships __pycache__")
    say(f"{wheel.name}: {len(names)} files, data files included, no demo code")


# -- project -------------------------------------------------------------------------------


def readme_commands(readme: Path) -> dict[str, list[str]]:
    """The README's tagged shell blocks: {"install": [line], "run development": [line, ...], ...},
    comments and blank lines dropped."""
    blocks: dict[str, list[str]] = {}
    for tag, code in README_COMMANDS.findall(readme.read_text()):
        check(tag not in blocks, f"README.md has two <!-- smoke: {tag} --> blocks")
        lines = [line.split("#", 1)[0].strip() for line in code.splitlines()]
        blocks[tag] = [line for line in lines if line]
    check(
        blocks.keys() == {"install", *README_RUNS},
        f"README.md's <!-- smoke: install|run ... --> blocks are {sorted(blocks)}, "
        f"not {sorted({'install', *README_RUNS})}",
    )
    return blocks


def readme_requirements(readme: Path) -> list[str]:
    """What the README's pip line installs besides the toolkit itself."""
    (line,) = readme_commands(readme)["install"]
    words = shlex.split(line)
    check(words[:2] == ["pip", "install"] and CHECKOUT in words, f"the README's install line: {line!r}")
    return [word for word in words[2:] if word != CHECKOUT]


def run_commands(readme: Path) -> dict[str, list[str]]:
    """The README's run commands, for this project, keyed by what they run (`migrate`, `daphne`...)."""
    commands: dict[str, list[str]] = {}
    for tag, expected in README_RUNS.items():
        keyed = {}
        for line in readme_commands(readme)[tag]:
            argv = shlex.split(line.replace("mysite", PROJECT))
            keyed[argv[2] if argv[:2] == ["python", "manage.py"] else argv[0]] = argv
        check(
            keyed.keys() == expected, f"README.md's {tag} block runs {sorted(keyed)}, not {sorted(expected)}"
        )
        commands.update(keyed)
    return commands


def write_project(readme: Path, root: Path) -> None:
    """What a team does after `django-admin startproject`: the README's lines, then its own app."""
    (root / "readme_commands.json").write_text(json.dumps(run_commands(readme)))
    blocks = README_BLOCK.findall(readme.read_text())
    for app, files in (("mysite", README_FILES), ("shop", README_SHOP_FILES)):
        covered = {path.split("/", 1)[1] for _, path, _ in blocks if path.startswith(f"{app}/")}
        check(
            covered >= files,
            f"README.md has no <!-- smoke: ... {app}/X --> block for {sorted(files - covered)} "
            "(the 'Use it in your project' section)",
        )
    check(
        all(path.split("/")[0] in ("mysite", "shop") for _, path, _ in blocks),
        f"a README block for a file of neither mysite nor shop: {[path for _, path, _ in blocks]}",
    )
    shutil.copytree(HERE / "shop", root / "shop", ignore=shutil.ignore_patterns("__pycache__"))
    for mode, path, code in blocks:
        target = root / path.replace("mysite", PROJECT, 1)
        code = code.replace("mysite", PROJECT) + "\n"
        if mode == "write" or not target.exists():
            target.write_text(code)
        else:
            target.write_text(
                target.read_text() + "\n\n# From the README's 'Use it in your project'.\n" + code
            )
    # The project's own, beyond the README: its app; SQLite waiting for its lock, as several
    # processes (the web servers, the worker, the router, the reclaimer, this script) share the
    # file; DEBUG off with ALLOWED_HOSTS, as in production, unless SMOKE_DEBUG=1 (the development
    # server's run, which keeps startproject's DEBUG = True and ALLOWED_HOSTS = []).
    (root / PROJECT / "settings.py").write_text(
        (root / PROJECT / "settings.py").read_text()
        + "\n\n# The smoke project's own.\n"
        + 'INSTALLED_APPS += ["shop"]\n'
        + 'DATABASES["default"]["OPTIONS"] = {"timeout": 20}\n'
        + 'if os.environ.get("SMOKE_DEBUG") != "1":\n'
        + "    DEBUG = False\n"
        + '    ALLOWED_HOSTS = ["127.0.0.1", "localhost"]\n'
    )
    (root / PROJECT / "urls.py").write_text(
        (root / PROJECT / "urls.py").read_text()
        + '\n\n# The smoke project\'s own.\nurlpatterns += [path("shop/", include("shop.urls"))]\n'
    )
    say(f"project {PROJECT} written from README.md ({len(blocks)} blocks) plus the app shop")


# -- run -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Stack:
    """The project's processes, each in a session of its own, logging to a file; stopped in
    reverse order by their own pids (SIGTERM, then SIGKILL after a grace period)."""

    def __init__(self, root: Path, env: dict):
        self.root, self.env = root, env
        self.processes: list[tuple[str, subprocess.Popen, Path]] = []

    def start(self, name: str, *command: str, env: dict | None = None) -> subprocess.Popen:
        log_path = self.root / f"{name}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command,
                cwd=self.root,
                env=env or self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.processes.append((name, process, log_path))
        with open(self.root / "pids", "a") as pids:  # for run_smoke.sh, should this script be killed
            pids.write(f"{process.pid}\n")
        return process

    def check_alive(self) -> None:
        for name, process, _ in self.processes:
            check(process.poll() is None, f"{name} exited with {process.returncode}")

    def stop(self) -> None:
        # One at a time, the last started first: Redis stops after everything that uses it.
        for name, process, _ in reversed(self.processes):
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(10)
            except ProcessLookupError:
                pass  # its group is gone already
            except subprocess.TimeoutExpired:
                say(f"{name} did not stop on SIGTERM within 10 s; killing it")
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        (self.root / "pids").unlink(missing_ok=True)

    def dump_logs(self) -> None:
        for name, _, log_path in self.processes:
            lines = log_path.read_text(errors="replace").splitlines()[-40:]
            print(f"----- {name} ({log_path}), last {len(lines)} lines -----", file=sys.stderr)
            print("\n".join(lines), file=sys.stderr)


def wait_for(predicate, *, until: float, what: str, stack: Stack | None = None, interval: float = 0.1):
    while True:
        value = predicate()
        if value:
            return value
        if stack is not None:
            stack.check_alive()
        check(time.monotonic() < until, f"timed out waiting for {what}")
        time.sleep(interval)


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
        return True
    except OSError:
        return False


def http(
    method: str,
    url: str,
    *,
    token: str | None = None,
    cookie: str | None = None,
    body=None,
    key: str | None = None,
):
    """(status, headers, parsed body) of one request; error statuses are answers, not raises."""
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    if cookie:
        headers["Cookie"] = cookie
    if key:
        headers["Idempotency-Key"] = key
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            status, response_headers, raw = response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        status, response_headers, raw = error.code, error.headers, error.read()
    content_type = response_headers.get("Content-Type", "")
    parsed = json.loads(raw) if "json" in content_type and raw else raw.decode(errors="replace")
    return status, response_headers, parsed


def manage(root: Path, env: dict, *args: str, until: float) -> str:
    return run_once([sys.executable, "manage.py", *args], root, env, until=until)


def run_once(argv: list[str], root: Path, env: dict, *, until: float) -> str:
    """A command run to its end, which must succeed; its output."""
    result = subprocess.run(
        argv,
        check=False,
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=max(1, until - time.monotonic()),
    )
    check(result.returncode == 0, f"{shlex.join(argv)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def check_installed_from_wheel() -> None:
    """Nothing comes from the checkout: the apps are the wheel's, the demo project is absent."""
    import importlib.util

    site = Path(sys.prefix).resolve()
    for name in ("idempotency", "eventbus", "gateway"):
        origin = Path(importlib.util.find_spec(name).origin).resolve()
        check(
            site in origin.parents and "site-packages" in origin.parts,
            f"{name} is imported from {origin}, not from this virtualenv's site-packages",
        )
    for name in ("config", "tests", "bench"):
        check(importlib.util.find_spec(name) is None, f"the demo's {name!r} is importable here")


def users(root: Path):
    """A user, their DRF token and a logged-in session cookie, made through Django itself."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.test import Client
    from rest_framework.authtoken.models import Token

    user = get_user_model().objects.create_user("smoke", password=uuid.uuid4().hex)
    token = Token.objects.create(user=user).key
    client = Client()
    client.force_login(user)  # a session in the database, as the login view makes it
    from django.conf import settings

    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    return token, f"{settings.SESSION_COOKIE_NAME}={session}"


def order_count() -> int:
    from shop.models import Order

    return Order.objects.count()


def check_idempotency(base: str, token: str) -> None:
    key = f"smoke-order-{uuid.uuid4()}"
    status, _, body = http("POST", f"{base}/shop/orders/", token=token, body={"sku": "A1"})
    check(status == 400, f"a POST without a key to a 'required' view got {status}, not 400: {body}")
    first = http("POST", f"{base}/shop/orders/", token=token, body={"sku": "A1"}, key=key)
    check(first[0] == 201, f"the keyed POST got {first[0]}: {first[2]}")
    check(first[1].get("Idempotent-Replayed") is None, "the first POST was marked replayed")
    again = http("POST", f"{base}/shop/orders/", token=token, body={"sku": "A1"}, key=key)
    check(again[0] == 201 and again[2] == first[2], f"the retry got {again[0]} {again[2]}, not {first[2]}")
    check(again[1].get("Idempotent-Replayed") == "true", "the retry has no 'Idempotent-Replayed: true'")
    check(order_count() == 1, f"{order_count()} orders after a POST and its retry, not 1")
    other = http("POST", f"{base}/shop/orders/", token=token, body={"sku": "B2"}, key=key)
    check(other[0] == 422, f"the same key with another body got {other[0]}, not 422")
    say(
        "idempotency: the README's OrderCreate ran once for a keyed POST, its retry replayed "
        "(Idempotent-Replayed: true), one row"
    )


def watch_job(ws_url: str, cookie: str, origin: str, until: float, on_frame=None) -> list[dict]:
    """Every frame of the job's socket until its final event, then a second more for strays;
    `on_frame(frame)` is called with each as it arrives (to act on the job meanwhile)."""
    from websockets.exceptions import ConnectionClosed, InvalidHandshake
    from websockets.sync.client import connect

    frames: list[dict] = []
    try:
        opened = connect(
            f"{ws_url}?last_seq=0", origin=origin, additional_headers={"Cookie": cookie}, open_timeout=10
        )
    except InvalidHandshake as refused:  # e.g. a 404 from a server that speaks no WebSocket
        raise SmokeFailure(f"the WebSocket handshake to {ws_url} failed: {refused}") from None
    with opened as socket_:
        final_at = None
        while True:
            now = time.monotonic()
            stop = min(until, final_at + 1.0) if final_at else until
            if now >= stop:
                break
            try:
                frame = json.loads(socket_.recv(timeout=stop - now))
            except TimeoutError:
                break
            except ConnectionClosed as closed:
                raise SmokeFailure(f"the job's socket closed: {closed}; frames so far: {frames}") from None
            frames.append(frame)
            if on_frame is not None:
                on_frame(frame)
            if frame.get("type") == "event" and frame.get("data", {}).get("final") and final_at is None:
                final_at = time.monotonic()
    check(final_at is not None, f"no final event before the deadline; frames: {frames}")
    return frames


def check_events(frames: list[dict]) -> list[int]:
    """The job's socket got each of its events once, in seq order, ending with the final one."""
    others = [f for f in frames if f.get("type") != "event"]
    check(not others, f"frames other than events: {others}")
    got = [(f["stage"], f["seq"]) for f in frames]
    check(got == EXPECTED_EVENTS, f"the socket got {got}, not {EXPECTED_EVENTS} (each once, in seq order)")
    final = frames[-1]["data"]
    check(
        final.get("state") == "COMPLETED" and final.get("text") == "hello smoke", f"the final event: {final}"
    )
    return [seq for _, seq in got]


def check_job(base: str, token: str, cookie: str, until: float) -> str:
    """A job of the project's own type, watched to its end; its id."""
    status, _, body = http(
        "POST",
        f"{base}/api/jobs/",
        token=token,
        key=f"smoke-bad-{uuid.uuid4()}",
        body={"domain": "no-such-type", "payload": {}},
    )
    check(status == 400, f"an unregistered job type got {status}, not 400: {body}")
    key = f"smoke-job-{uuid.uuid4()}"
    status, _, job = http(
        "POST",
        f"{base}/api/jobs/",
        token=token,
        key=key,
        body={"domain": "greet", "payload": {"who": "smoke"}},
    )
    check(status == 201, f"POST /api/jobs/ for the project's own type got {status}: {job}")
    replay = http(
        "POST",
        f"{base}/api/jobs/",
        token=token,
        key=key,
        body={"domain": "greet", "payload": {"who": "smoke"}},
    )
    check(replay[2] == job and replay[1].get("Idempotent-Replayed") == "true", f"the job's retry: {replay}")
    from idempotency.models import Operation

    jobs = Operation.objects.filter(domain="greet").count()
    check(jobs == 1, f"{jobs} greet jobs (Operations) after a POST and its retry, not 1")
    say(f"job {job['job_id']} accepted ({job['domain']}); watching {job['ws_url']}")
    frames = watch_job(job["ws_url"], cookie, base, until)
    seqs = check_events(frames)

    def completed():
        return http("GET", f"{base}/api/jobs/{job['job_id']}/", token=token)[2].get("state") == "COMPLETED"

    wait_for(completed, until=until, what="the job's state COMPLETED in GET /api/jobs/<id>/")
    say(f"job: {len(frames)} events over the WebSocket, each once, in seq order: {seqs}, final COMPLETED")
    return job["job_id"]


# The Checkout job of shop/jobs.py: the seq of each event, as the toolkit numbers them (each of
# its four stages reports one, or gets one when it finishes; the final one is 51).
CHECKOUT_SEQS = [10, 20, 30, 40, 51]


def final_of(frames: list[dict]) -> dict:
    """The final event's data, after checking that the socket got each seq once, in order."""
    others = [f for f in frames if f.get("type") != "event"]
    check(not others, f"frames other than events: {others}")
    seqs = [f["seq"] for f in frames]
    check(seqs == sorted(set(seqs)), f"the socket got seqs {seqs}: a duplicate or out of order")
    check(frames[-1]["data"].get("final"), f"the last frame is not the final event: {frames[-1]}")
    return frames[-1]["data"]


def start_checkout(
    base: str, token: str, outside: Path, name: str, files: dict[str, str], **payload
) -> tuple[dict, Path]:
    """A Checkout job whose outside world (its directory) holds `files` before it starts."""
    directory = outside / name
    directory.mkdir(parents=True)
    for file_name, text in files.items():
        (directory / file_name).write_text(text)
    status, _, job = http(
        "POST",
        f"{base}/api/jobs/",
        token=token,
        key=f"smoke-{name}-{uuid.uuid4()}",
        body={"domain": "checkout", "payload": {"dir": str(directory), **payload}},
    )
    check(status == 201, f"POST /api/jobs/ for checkout ({name}) got {status}: {job}")
    return job, directory


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def check_stage_retry(base: str, token: str, cookie: str, outside: Path, until: float) -> None:
    """A stage whose outside API fails once (503) runs again, with the same key, and the job
    completes; the watcher sees each event once."""
    from eventbus.models import StageRecord

    job, directory = start_checkout(base, token, outside, "retried-stage", {"pay-failures": "1"})
    frames = watch_job(job["ws_url"], cookie, base, until)
    final = final_of(frames)
    check(final.get("state") == "COMPLETED", f"the retried stage's job ended {final}")
    seqs = [f["seq"] for f in frames]
    check(seqs == CHECKOUT_SEQS, f"the socket got {seqs}, not {CHECKOUT_SEQS}")
    pay_key = f"{job['job_id']}:pay"
    calls = lines(directory / "pay-calls")
    check(calls == [pay_key, pay_key], f"the bank was called with {calls}, not twice with {pay_key}")
    attempts = StageRecord.objects.get(operation_id=job["job_id"], stage="pay").attempts
    check(attempts == 2, f"the pay stage's record says {attempts} attempts, not 2")
    say(f"stage retry: pay failed once (503) and ran again with the same key; COMPLETED, seqs {seqs}")


def check_cancel(base: str, token: str, cookie: str, outside: Path, until: float) -> None:
    """A long stage cancelled through the API stops; the job ends CANCELLED with its final event."""
    job, directory = start_checkout(base, token, outside, "cancelled", {}, wait=60)
    job_url = f"{base}/api/jobs/{job['job_id']}"
    answers: list[tuple[int, dict]] = []

    def cancel_once_waiting(frame: dict) -> None:
        if frame.get("stage") == "wait" and not answers:
            status, _, body = http("POST", f"{job_url}/cancel/", token=token)
            answers.append((status, body))

    final = final_of(watch_job(job["ws_url"], cookie, base, until, on_frame=cancel_once_waiting))
    check(answers and answers[0][0] == 202, f"POST .../cancel/ answered {answers}")
    check(final.get("state") == "CANCELLED", f"the cancelled job's final event: {final}")
    state = http("GET", f"{job_url}/", token=token)[2].get("state")
    check(state == "CANCELLED", f"GET /api/jobs/<id>/ says {state} after the cancel")
    runs = [line.split()[0] for line in lines(directory / "runs")]
    check(runs == ["prepare", "pay", "wait"], f"stages run: {runs} (ship must not start)")
    again = http("POST", f"{job_url}/cancel/", token=token)
    check(again[0] == 409, f"cancelling the ended job got {again[0]}, not 409: {again[2]}")
    say(
        "cancel: the waiting stage stopped, no later stage started, CANCELLED with its final event; again: 409"
    )


def check_job_retry(base: str, token: str, cookie: str, outside: Path, until: float) -> None:
    """A job that fails, retried through the API once its cause is gone: the new job completes,
    its finished stages not run again, every stage under the first job's keys."""
    from idempotency.models import Operation

    job, directory = start_checkout(base, token, outside, "retried-job", {"broken": ""})
    final = final_of(watch_job(job["ws_url"], cookie, base, until))
    check(final.get("state") == "FAILED", f"the job meant to fail ended {final}")
    early = http("POST", f"{base}/api/jobs/{job['job_id']}/retry/", token=token)
    check(early[0] == 400, f"a retry without an Idempotency-Key got {early[0]}, not 400: {early[2]}")

    (directory / "broken").unlink()  # the cause removed
    key = f"smoke-retry-{uuid.uuid4()}"
    status, _, retry = http("POST", f"{base}/api/jobs/{job['job_id']}/retry/", token=token, key=key)
    check(status == 201, f"POST /api/jobs/<id>/retry/ got {status}: {retry}")
    replay = http("POST", f"{base}/api/jobs/{job['job_id']}/retry/", token=token, key=key)
    check(
        replay[0] == 201 and replay[2]["job_id"] == retry["job_id"],
        f"the retry's replay: {replay[0]} {replay[2]}",
    )
    new = Operation.objects.get(pk=retry["job_id"])
    check(str(new.retry_of_id) == job["job_id"], f"the new job's retry_of is {new.retry_of_id}")
    frames = watch_job(retry["ws_url"], cookie, base, until)
    final = final_of(frames)
    check(final.get("state") == "COMPLETED", f"the retried job ended {final}")
    runs = lines(directory / "runs")
    first = job["job_id"]
    expected = [f"{stage} {first}:{stage}" for stage in ("prepare", "pay", "wait", "ship", "ship")]
    check(
        runs == expected, f"stages run: {runs}, not {expected} (finished stages once, the first job's keys)"
    )
    check(len(lines(directory / "pay-calls")) == 1, "the bank was called again by the retried job")
    old = http("GET", f"{base}/api/jobs/{first}/", token=token)[2].get("state")
    check(old == "FAILED", f"the old job is {old} after its retry, not FAILED")
    say(
        f"job retry: FAILED, retried once the cause was removed (201, replayed); job {retry['job_id']} "
        f"ran only ship and COMPLETED ({[f['seq'] for f in frames]}), under the first job's keys"
    )


def check_admin(base: str, job_id: str) -> None:
    """The admin of jobs and dead letters, as staff see it: a job's timeline, the dead letters'
    page (a model without a table, whose permissions migrate made) and its Redrive button."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    admin_user = get_user_model().objects.create_superuser("smoke-admin", password=uuid.uuid4().hex)
    client = Client()
    client.force_login(admin_user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    status, _, page = http("GET", f"{base}/admin/idempotency/operation/{job_id}/change/", cookie=cookie)
    check(
        status == 200 and "<th>next attempt</th>" in page, f"a job's admin page got {status}: {page[:2000]}"
    )
    status, _, page = http("GET", f"{base}/admin/eventbus/deadletter/", cookie=cookie)
    check(
        status == 200 and "checkout: 0 dead letters" in page,
        f"the dead letters' admin page got {status}: {page[:2000]}",
    )
    say("admin: a job's page shows its stages' timeline; the dead letters' page lists every domain")


class Assets(HTMLParser):
    """The URLs of what a page makes the browser load: scripts, style sheets, icons, images."""

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag in ("script", "img") and attributes.get("src"):
            self.urls.append(attributes["src"])
        elif tag == "link" and attributes.get("href") and attributes.get("rel") in ("stylesheet", "icon"):
            self.urls.append(attributes["href"])


# What a browser accepts for each kind of file: it refuses a script or style sheet served as
# text/html (a 404 page), which leaves the page unstyled and its buttons dead.
ASSET_TYPES = {
    ".js": ("text/javascript", "application/javascript"),
    ".css": ("text/css",),
    ".svg": ("image/svg+xml",),
    ".ico": ("image/x-icon", "image/vnd.microsoft.icon"),
}


def check_assets(base: str, page_path: str, *, cookie: str | None = None, must_have: tuple = ()) -> int:
    """Every script, style sheet and icon the page at page_path references answers 200 with its
    kind's content type; the number of them."""
    status, _, page = http("GET", f"{base}{page_path}", cookie=cookie)
    check(status == 200, f"{page_path} got {status}: {page[:2000]}")
    parser = Assets()
    parser.feed(page)
    urls = parser.urls
    for wanted in must_have:
        check(any(wanted in url for url in urls), f"{page_path} references no {wanted}: {urls}")
    wrong = []
    for url in urls:
        check(url.startswith("/"), f"{page_path} references {url}, not a path of this site")
        status, headers, body = http("GET", f"{base}{url}", cookie=cookie)
        content_type = headers.get("Content-Type", "").split(";")[0].strip()
        expected = ASSET_TYPES.get(Path(url.split("?")[0]).suffix, (content_type,))
        if not (status == 200 and content_type in expected and body):
            wrong.append(f"{url} answered {status} {content_type!r}, not 200 {' or '.join(expected)}")
    check(not wrong, f"what {base}{page_path} references:\n  " + "\n  ".join(wrong))
    return len(urls)


def check_page(base: str, cookie: str) -> None:
    page_assets = check_assets(
        base, "/", cookie=cookie, must_have=("gateway/app.js", "gateway/jobstream.js", "gateway/app.css")
    )
    login_assets = check_assets(base, "/accounts/login/", must_have=("gateway/app.css",))
    admin_assets = check_assets(base, "/admin/login/", must_have=("admin/css/base.css",))
    say(
        f"the gateway's page, its login page and the admin's render; the {page_assets}, {login_assets} "
        f"and {admin_assets} scripts, style sheets and icons they reference answer 200 with their types"
    )


def run(root: Path, redis_server: str, timeout: float) -> None:
    until = time.monotonic() + timeout
    check_installed_from_wheel()
    commands = json.loads((root / "readme_commands.json").read_text())
    redis_port, web_port, dev_port = free_port(), free_port(), free_port()
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": str(root),  # the project alone: nothing from the checkout
        "DJANGO_SETTINGS_MODULE": f"{PROJECT}.settings",
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "PYTHONUNBUFFERED": "1",
    }
    os.environ.update({k: env[k] for k in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "REDIS_URL")})
    sys.path.insert(0, str(root))

    def readme(name: str, *own: str) -> list[str]:
        """The README's command `name`, run from this virtualenv, with this test's own options."""
        argv = commands[name]
        program = sys.executable if argv[0] == "python" else os.path.join(bin_dir, argv[0])
        return [program, *argv[1:], *own]

    stack = Stack(root, env)
    try:
        stack.start(
            "redis",
            redis_server,
            "--port",
            str(redis_port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(root),
        )
        wait_for(lambda: port_open(redis_port), until=until, what="redis-server", stack=stack)
        manage(root, env, "makemigrations", "shop", until=until)
        manage(root, env, "check", until=until)
        for name in ("migrate", "collectstatic"):
            run_once(readme(name), root, env, until=until)
        token, cookie = users(root)
        # The worker in one process (solo) without the cluster chatter: all this run needs.
        stack.start("worker", *readme("celery", "-P", "solo", "--without-mingle", "--without-gossip"))
        stack.start("router", *readme("run_router"))
        stack.start("reclaimer", *readme("run_reclaimer"))
        stack.start("daphne", *readme("daphne", "-b", "127.0.0.1", "-p", str(web_port)))
        wait_for(lambda: port_open(web_port), until=until, what="daphne", stack=stack)
        base = f"http://127.0.0.1:{web_port}"
        say(f"production: redis :{redis_port}, celery worker, run_router, run_reclaimer, daphne :{web_port}")

        check_idempotency(base, token)
        job_id = check_job(base, token, cookie, until)
        outside = root / "outside"  # Checkout's outside world (shop/jobs.py)
        check_stage_retry(base, token, cookie, outside, until)
        check_cancel(base, token, cookie, outside, until)
        check_job_retry(base, token, cookie, outside, until)
        check_admin(base, job_id)
        check_page(base, cookie)

        # Development: runserver (daphne's, with DEBUG on) in place of daphne, same worker and router.
        stack.start(
            "runserver",
            *readme("runserver", "--noreload", f"127.0.0.1:{dev_port}"),
            env={**env, "SMOKE_DEBUG": "1"},
        )
        wait_for(lambda: port_open(dev_port), until=until, what="runserver", stack=stack)
        dev = f"http://127.0.0.1:{dev_port}"
        say(f"development: runserver :{dev_port} (DEBUG on)")
        check_page(dev, cookie)
        seqs = check_events(watch_job(f"ws://127.0.0.1:{dev_port}/ws/jobs/{job_id}/", cookie, dev, until))
        say(f"runserver's WebSocket replays the job's events from seq 0: {seqs}")
        stack.check_alive()
    except BaseException:
        stack.stop()
        stack.dump_logs()
        raise
    stack.stop()


def _stopped(signum, frame):
    raise SmokeFailure(f"stopped by signal {signum} (run_smoke.sh's time limit?)")


def main(argv: list[str]) -> int:
    # `timeout` (run_smoke.sh) sends SIGTERM: unwind through the clean-ups, which stop the stack.
    signal.signal(signal.SIGTERM, _stopped)
    try:
        if argv[:1] == ["wheel"] and len(argv) == 2:
            check_wheel(Path(argv[1]))
        elif argv[:1] == ["requirements"] and len(argv) == 2:
            print("\n".join(readme_requirements(Path(argv[1]))))
        elif argv[:1] == ["project"] and len(argv) == 3:
            write_project(Path(argv[1]), Path(argv[2]))
        elif argv[:1] == ["run"] and len(argv) == 2:
            started = time.monotonic()
            run(
                Path(argv[1]),
                os.environ.get("SMOKE_REDIS_SERVER") or "redis-server",
                float(os.environ.get("SMOKE_TIMEOUT", "120")),
            )
            say(f"PASSED in {time.monotonic() - started:.0f} s (the live part)")
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except SmokeFailure as failure:
        print(f"smoke: FAILED: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
