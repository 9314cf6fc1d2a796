"""The installed-toolkit smoke test, driven by tests/smoke/run_smoke.sh: the tutorial
(docs/tutorial.md) run as written.

Runs with the Python of a fresh virtualenv outside the repository, into which only the built
wheel, what the tutorial's pip line adds (whitenoise) and `websockets` (the WebSocket client of
this test) were installed, so every import of `idempotency`, `eventbus` or `gateway` comes from
the wheel. Subcommands:

    smoke.py wheel WHEEL                the wheel ships the apps' data files, and no demo code
    smoke.py requirements TUTORIAL      print what the tutorial's pip line installs besides the
                                        toolkit, one per line (run_smoke.sh installs those too)
    smoke.py tutorial TUTORIAL DIR      every block of the tutorial, in order, in DIR

Every fenced block of the tutorial carries a tag just above it, `<!-- smoke: KIND ARGS -->`:

    install                 the pip line (run_smoke.sh runs it, the wheel in place of the checkout)
    write FILE, append FILE a file of the project, relative to the folder the shell is in
    sh NAME                 shell commands, run to their end by bash in one session that goes on
                            from block to block (its folder and variables: `cd mysite`, `JOB=...`);
                            `sh backport` (the django-tasks backport's pip line) only on Django 5.2
    run tasks               run_jobs stopped, as Ctrl-C in its terminal would, and started again as
                            the block says, once the tasks' settings and code are written (runserver
                            too: it runs here with --noreload, where the tutorial's reloads itself)
    run development         the development stack, one process a line, started in the background:
                            the tutorial's own redis-server (on a free port in place of 6380, while
                            a Redis, or a placeholder of this test's, holds 6379), run_jobs and
                            runserver (DEBUG on)
    run production          its `export` lines, then collectstatic, run to its end, run_jobs and
                            daphne (DEBUG off), once runserver and run_jobs are stopped as it says
    output NAME             what a terminal shows; not run (the checks around it check it)

A curl to 127.0.0.1:8000 goes to the server started last. Between the blocks this test checks
what the tutorial says happens (Tutorial's `before_<name>` and `after_<name>` methods, around
the `sh <name>` blocks): run_jobs's processes each saying they run, the keyed order created once
and replayed, the refund's card appearing on a page open in chromium without a reload (the
repository's Python drives it: tests/smoke/browser.py; said plainly where it cannot run, an
error on CI), its events over the WebSocket each once and in seq order, the cancel stopping the
hold stage before any payment, the failed job retried under its first key (and once: another
key gets a 409 naming the retry), the worker killed mid-job and the job resumed once (its
finished stages not run again, one payment, the refund recorded once by its atomic stage, one
mail), and each completed refund's order updated by its record stage's one attempt; Django's
tasks: the backport present on Django 5.2 only, the export enqueued by a keyed POST once (its job
keyed `export-1:1`, owned by the user; the POST again replayed with the same task id), its card
on the page, its progress events over the WebSocket each once and in order, its result
SUCCESSFUL from another process, the delayed receipt READY and unsent until its run_after, keyed
in code (the same id again), started by the sweeper once due and mailed once, and the schedule's
ticks enqueued by run_jobs's scheduler, keyed by their tick, and run. Then its own checks, on
daphne: a keyed POST without a key and with another body, a stage retried after the bank's 503,
the admin's job page and dead letters, keyed POST /api/jobs/ from several users at once on the
tutorial's SQLite (no 503), and, under both servers, that every script, style sheet and icon the page, its login
page and the admin's login page reference answers 200 with its content type; runserver's
WebSocket replays a job's events; the test file of docs/howto/test-job-types.md, written into the
project as that page says, passes (its tagged blocks are run as the tutorial's are); and the
tutorial's Redis left no append-only file in the project. It stops every process it started,
whatever happens, and exits 1 with the reason and the processes' logs on failure.
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
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path

PROJECT = "mysite"
# A tagged fenced block: the tag, then the fence's language and body.
BLOCK = re.compile(r"<!-- smoke: ([^>]*?) -->\s*\n```([a-z]*)\n(.*?)\n```", re.DOTALL)
FENCE = re.compile(r"^```", re.MULTILINE)
CHECKOUT = "/path/to/this/checkout"  # the tutorial's placeholder for what run_smoke.sh built the wheel from
SERVER = "127.0.0.1:8000"  # the tutorial's address, replaced by the port of the server started last
RUNS = {
    "run development": {"redis-server", "run_jobs", "runserver"},
    "run production": {"collectstatic", "run_jobs", "daphne"},
    "run tasks": {"run_jobs"},
}
# What run_jobs starts; each says it runs (the supervisor's line, then the process's own).
JOBS_PROCESSES = {
    "worker": "celery@",  # Celery's "celery@<host> ready."
    "router": "run_router: running",
    "reclaimer": "run_reclaimer: running",
    "sweeper": "Sweeping every",
    "scheduler": "Scheduling ",
}
TUTORIAL_REDIS_PORT = "6380"  # the tutorial's own Redis, replaced by a free port as 8000 is
TAKEN_PORT = 6379  # a Redis already running there (Debian's service) must not get in the way
BACKPORT = "backport"  # the `sh` block of Django 5.2's django-tasks backport
USERS_AT_ONCE, POSTS_EACH = 4, 5  # keyed POST /api/jobs/ sent at once on the tutorial's SQLite
# The tutorial's Refund (shop/jobs.py): (stage, seq) of each event, as the toolkit numbers them.
REFUND_EVENTS = [("check", 10), ("hold", 20), ("pay", 30), ("record", 40), ("notify", 50), ("done", 61)]


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
        tops == {"exactly_once", "idempotency", "eventbus", "gateway"},
        f"the wheel's top-level packages are {sorted(tops)}",
    )
    for required in (
        "eventbus/bus/lua/publish.lua",
        "eventbus/bus/lua/route.lua",
        "eventbus/bus/lua/_prelude.lua",
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
# -- the tutorial's blocks -------------------------------------------------------------------


def tutorial_blocks(tutorial: Path) -> list[tuple[str, str, str]]:
    """(tag, language, code) of every fenced block, in order; each must be tagged."""
    text = tutorial.read_text()
    blocks = BLOCK.findall(text)
    fences = len(FENCE.findall(text)) // 2
    check(
        fences == len(blocks),
        f"{tutorial.name} has {fences} fenced blocks, {len(blocks)} of them tagged <!-- smoke: ... -->",
    )
    for tag, _, _ in blocks:
        kind = tag.split()[0]
        check(
            kind in ("install", "write", "append", "sh", "output") or tag in RUNS,
            f"{tutorial.name}: unknown tag <!-- smoke: {tag} -->",
        )
    runs = [tag for tag, _, _ in blocks if tag in RUNS]
    check(
        sorted(runs) == sorted(RUNS),
        f"{tutorial.name}'s run blocks are {runs}, not one of each of {list(RUNS)}",
    )
    return blocks


def command_lines(code: str) -> list[str]:
    lines = [line.split("#", 1)[0].strip() for line in code.splitlines()]
    return [line for line in lines if line]


def tutorial_requirements(tutorial: Path) -> list[str]:
    """What the tutorial's pip line installs besides the toolkit itself."""
    installs = [code for tag, _, code in tutorial_blocks(tutorial) if tag == "install"]
    check(len(installs) == 1, f"{tutorial.name} has {len(installs)} <!-- smoke: install --> blocks, not 1")
    (line,) = command_lines(installs[0])
    words = shlex.split(line)
    check(words[:2] == ["pip", "install"] and CHECKOUT in words, f"the tutorial's install line: {line!r}")
    return [word for word in words[2:] if word != CHECKOUT]


def keyed_commands(tag: str, code: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """A run block's lines, keyed by what they start (a manage.py command's name, else the
    program), and the variables its `export NAME=value` lines set for them."""
    keyed, exported = {}, {}
    for line in command_lines(code):
        argv = shlex.split(line)
        if argv[0] == "export":
            name, _, value = argv[1].partition("=")
            exported[name] = value
            continue
        keyed[argv[2] if argv[:2] == ["python", "manage.py"] else argv[0]] = argv
    check(
        keyed.keys() == RUNS[tag], f"the tutorial's {tag} block runs {sorted(keyed)}, not {sorted(RUNS[tag])}"
    )
    return keyed, exported


class Shell:
    """One bash session over many blocks: each block runs in a new bash that starts in the folder
    and with the variables the last one ended with (every variable it sets is exported)."""

    def __init__(self, cwd: Path, env: dict, state: Path):
        self.cwd, self.env, self.state = cwd, env, state
        self.server = SERVER

    def run(self, name: str, code: str, *, until: float) -> str:
        code = code.replace(SERVER, self.server)
        variables, folder = self.state / "variables.sh", self.state / "folder"
        script = "\n".join(
            [
                "set -a",
                f"[ -f {shlex.quote(str(variables))} ] && . {shlex.quote(str(variables))}",
                "set -e",
                code,
                f"export -p > {shlex.quote(str(variables))}",
                f"pwd > {shlex.quote(str(folder))}",
            ]
        )
        result = subprocess.run(
            ["bash", "-c", script],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=max(1, until - time.monotonic()),
            check=False,
        )
        check(
            result.returncode == 0,
            f"the tutorial's `sh {name}` block failed ({result.returncode}):\n{code}\n{result.stdout}\n{result.stderr}",
        )
        self.cwd = Path(folder.read_text().strip())
        (self.state / f"{name}.out").write_text(result.stdout)  # for SMOKE_KEEP=1: what a reader sees
        return result.stdout

    def variable(self, name: str) -> str:
        """A variable the blocks set (TOKEN, JOB), as the next block would see it."""
        script = f'. {shlex.quote(str(self.state / "variables.sh"))}; printf %s "${name}"'
        value = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
        check(value, f"the tutorial's blocks set no {name}")
        return value


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
            self._stop(name, process)
        (self.root / "pids").unlink(missing_ok=True)

    def stop_one(self, name: str) -> None:
        """Stop one process, as Ctrl-C in its terminal would (its log stays)."""
        (found,) = [(n, p) for n, p, _ in self.processes if n == name]
        self._stop(*found)
        self.processes = [entry for entry in self.processes if entry[0] != name]

    @staticmethod
    def _stop(name: str, process: subprocess.Popen) -> None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(15)
        except ProcessLookupError:
            pass  # its group is gone already
        except subprocess.TimeoutExpired:
            say(f"{name} did not stop on SIGTERM within 15 s; killing it")
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

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


def django_major() -> int:
    import django

    return django.VERSION[0]


def module_found(name: str) -> bool:
    """Whether `name` imports here now (a pip line of the tutorial's may have just installed it)."""
    import importlib
    import importlib.util

    importlib.invalidate_caches()
    return importlib.util.find_spec(name) is not None


def check_installed_from_wheel() -> None:
    """Nothing comes from the checkout: the apps are the wheel's, the demo project is absent."""
    import importlib.util

    site = Path(sys.prefix).resolve()
    for name in ("exactly_once", "idempotency", "eventbus", "gateway"):
        origin = Path(importlib.util.find_spec(name).origin).resolve()
        check(
            site in origin.parents and "site-packages" in origin.parts,
            f"{name} is imported from {origin}, not from this virtualenv's site-packages",
        )
    for name in ("config", "tests", "bench"):
        check(importlib.util.find_spec(name) is None, f"the demo's {name!r} is importable here")


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


def final_of(frames: list[dict]) -> dict:
    """The final event's data, after checking that the socket got each seq once, in order."""
    others = [f for f in frames if f.get("type") != "event"]
    check(not others, f"frames other than events: {others}")
    seqs = [f["seq"] for f in frames]
    check(seqs == sorted(set(seqs)), f"the socket got seqs {seqs}: a duplicate or out of order")
    check(frames[-1]["data"].get("final"), f"the last frame is not the final event: {frames[-1]}")
    return frames[-1]["data"]


# -- the tutorial, run ---------------------------------------------------------------------


def alice_cookie() -> str:
    """A logged-in session of the tutorial's user, made through Django itself."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(username="alice"))
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def headers_of(output: str) -> list[str]:
    """The status line and headers of `curl -i` output (its CRLFs read as LFs), lower-cased."""
    return [line.strip().lower() for line in output.split("\n\n", 1)[0].splitlines()]


def job_state(base: str, token: str, job_id: str) -> dict:
    return http("GET", f"{base}/api/jobs/{job_id}/", token=token)[2]


def stage_of(base: str, token: str, job_id: str, stage: str) -> dict:
    """A stage of a job as the jobs API shows it: {"name", "state", "attempts", ...}."""
    (found,) = [s for s in job_state(base, token, job_id)["stages"] if s["name"] == stage]
    return found


def db_state(job_id: str) -> str:
    """A job's state as the database has it: for the long waits, which polling the jobs API
    would spend the user's throttle on (120 requests a minute)."""
    from eventbus.models import Job

    return Job.objects.values_list("state", flat=True).get(pk=job_id)


def bank_refunds(key: str) -> int:
    from shop.models import BankRefund

    return BankRefund.objects.filter(idempotency_key=key).count()


def check_recorded(job_id: str, what: str) -> None:
    """The refund's atomic record stage finished in one attempt, and the order's update is that
    attempt's: the order refunded at a time between the attempt's start and the write that
    recorded its end (the two committed together)."""
    from shop.models import Order

    from eventbus.models import Job, StageRecord

    order = Order.objects.get(pk=Job.objects.get(pk=job_id).payload["order"])
    record = StageRecord.objects.filter(job_id=job_id, stage="record").first()
    check(record is not None, f"the {what}'s record stage never started")
    check(
        record.finished_at is not None and record.attempts == 1,
        f"the {what}'s record stage: finished {record.finished_at}, {record.attempts} attempts, not once",
    )
    check(
        order.refunded
        and order.refunded_at is not None
        and record.started_at <= order.refunded_at <= record.finished_at,
        f"the {what}'s order {order.pk}: refunded {order.refunded} at {order.refunded_at}, not within its "
        f"record stage ({record.started_at} to {record.finished_at})",
    )


def check_not_recorded(job_id: str, what: str) -> None:
    """The record stage never ran: the order is not refunded."""
    from shop.models import Order

    from eventbus.models import Job, StageRecord

    order = Order.objects.get(pk=Job.objects.get(pk=job_id).payload["order"])
    attempts = StageRecord.objects.filter(job_id=job_id, stage="record").values_list("attempts", flat=True)
    check(not any(attempts), f"the {what}'s record stage ran ({list(attempts)} attempts)")
    check(
        not order.refunded and order.refunded_at is None,
        f"the {what}'s order {order.pk} is refunded ({order.refunded_at})",
    )


class Tutorial:
    """The tutorial's blocks in order, with this test's checks between them."""

    def __init__(self, tutorial: Path, work: Path, redis_server: str, until: float):
        self.tutorial, self.work, self.redis_server, self.until = tutorial, work, redis_server, until
        bin_dir = str(Path(sys.executable).parent)
        self.bin_dir = bin_dir
        self.redis_port, self.dev_port, self.web_port = free_port(), free_port(), free_port()
        # The tutorial's `~` (its Redis's folder): a home of this run's, outside the project.
        self.home = work.parent / "home"
        self.home.mkdir(exist_ok=True)
        self.env = {
            **os.environ,
            "HOME": str(self.home),
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "VIRTUAL_ENV": str(Path(sys.executable).parent.parent),
            "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("PYTHONPATH", None)
        self.env.pop("DJANGO_SETTINGS_MODULE", None)
        state = work / "shell"
        state.mkdir()
        self.shell = Shell(work, self.env, state)
        self.stack: Stack | None = None
        self.root = work
        self.dev = self.web = ""
        self.jobs: dict[str, str] = {}  # the tutorial's jobs by block: refund, hold, bank-down, retry
        self.placeholder: socket.socket | None = None  # holds port 6379 when no Redis does
        self.browser: subprocess.Popen | None = None  # the page, open in chromium (tests/smoke/browser.py)

    # The processes

    def program(self, argv: list[str], *own: str) -> list[str]:
        """A command of the tutorial, run from this virtualenv, with this test's own options."""
        if argv[0] == "python":
            program = sys.executable
        elif argv[0] == "redis-server":
            program = self.redis_server
        else:
            program = os.path.join(self.bin_dir, argv[0])
        return [program, *argv[1:], *own]

    def django(self) -> None:
        """This process as one more of the project's, for the checks that read its database."""
        import django

        if not getattr(self, "_django", False):
            os.environ.update(
                {"DJANGO_SETTINGS_MODULE": f"{PROJECT}.settings", "REDIS_URL": self.env["REDIS_URL"]}
            )
            sys.path.insert(0, str(self.root))
            django.setup()
            check_installed_from_wheel()
            self._django = True

    def run_development(self, code: str) -> None:
        commands, _ = keyed_commands("run development", code)
        self.root = self.shell.cwd
        check(
            (self.root / "manage.py").exists(), f"no manage.py in {self.root}, where the tutorial's shell is"
        )
        run_once([sys.executable, "manage.py", "check"], self.root, self.env, until=self.until)
        self.stack = stack = Stack(self.root, self.env)
        self.start_redis(commands["redis-server"])
        self.start_jobs(commands["run_jobs"], self.env)
        stack.start(
            "runserver", *self.program(commands["runserver"], "--noreload", f"127.0.0.1:{self.dev_port}")
        )
        wait_for(lambda: port_open(self.dev_port), until=self.until, what="runserver", stack=stack)
        self.dev = f"http://127.0.0.1:{self.dev_port}"
        self.shell.server = f"127.0.0.1:{self.dev_port}"
        say(
            f"development: redis :{self.redis_port} beside the one on :{TAKEN_PORT}, run_jobs, runserver :{self.dev_port}"
        )

    def start_redis(self, argv: list[str]) -> None:
        """The tutorial's redis-server line as written, on a free port in place of its own, while
        a Redis (or, on a machine without one, this test's placeholder) listens on 6379."""
        if not port_open(TAKEN_PORT):
            self.placeholder = socket.create_server(("127.0.0.1", TAKEN_PORT))
            say(f"nothing listens on :{TAKEN_PORT}: a placeholder socket takes it, as Debian's Redis would")
        argv = [str(self.redis_port) if word == TUTORIAL_REDIS_PORT else word for word in argv]
        check(
            str(self.redis_port) in argv,
            f"the tutorial's redis-server runs on no --port {TUTORIAL_REDIS_PORT}",
        )
        argv = [f"{self.home}{word[1:]}" if word.startswith("~/") else word for word in argv]
        folder = Path(argv[argv.index("--dir") + 1]) if "--dir" in argv else self.root
        check(
            self.root not in (folder, *folder.parents),
            f"the tutorial's Redis keeps its files in {folder}, inside the project",
        )
        assert self.stack is not None
        self.stack.start("redis", *self.program(argv))
        wait_for(lambda: port_open(self.redis_port), until=self.until, what="redis-server", stack=self.stack)

    def start_jobs(self, argv: list[str], env: dict) -> None:
        """run_jobs, and each of its processes saying it runs."""
        assert self.stack is not None
        self.stack.start("jobs", *self.program(argv), env=env)
        for name, running in JOBS_PROCESSES.items():
            wait_for(
                lambda name=name, running=running: any(
                    line.startswith(f"{name} ") and running in line
                    for line in self.stack.log("jobs").splitlines()
                ),
                until=self.until,
                what=f"run_jobs's {name} to say it runs ({running!r})",
                stack=self.stack,
            )
        say(f"run_jobs: {', '.join(JOBS_PROCESSES)} started, each saying it runs")

    def run_production(self, code: str) -> None:
        commands, exported = keyed_commands("run production", code)
        # As the tutorial says: runserver and run_jobs stopped first.
        assert self.stack is not None
        self.stack.stop_one("runserver")
        self.stack.stop_one("jobs")
        (self.root / "jobs.log").rename(self.root / "jobs-development.log")
        production = {**self.env, **exported}
        run_once(self.program(commands["collectstatic"]), self.root, production, until=self.until)
        self.start_jobs(commands["run_jobs"], production)
        self.stack.start(
            "daphne",
            *self.program(commands["daphne"], "-b", "127.0.0.1", "-p", str(self.web_port)),
            env=production,
        )
        wait_for(lambda: port_open(self.web_port), until=self.until, what="daphne", stack=self.stack)
        self.web = f"http://127.0.0.1:{self.web_port}"
        self.shell.server = f"127.0.0.1:{self.web_port}"
        status, _, page = http("GET", f"{self.web}/no-such-page/")
        check(status == 404 and "URLconf" not in page, f"daphne answers with DEBUG on: {status} {page[:500]}")
        say(f"production: {exported}, collectstatic, run_jobs, daphne :{self.web_port} (DEBUG off)")

    def restart_jobs(self, code: str) -> None:
        """run_jobs stopped (Ctrl-C) and started again as the block says; runserver too, which
        the tutorial's reloads itself but this test runs with --noreload."""
        commands, _ = keyed_commands("run tasks", code)
        argv = commands["run_jobs"]
        assert self.stack is not None
        for name in ("jobs", "runserver"):
            self.stack.stop_one(name)
            (self.root / f"{name}.log").rename(self.root / f"{name}-before-tasks.log")
        self.start_jobs(argv, self.env)
        self.stack.start(
            "runserver",
            *self.program(["python", "manage.py", "runserver"], "--noreload", f"127.0.0.1:{self.dev_port}"),
        )
        wait_for(lambda: port_open(self.dev_port), until=self.until, what="runserver", stack=self.stack)
        check(
            "Scheduling 1 schedule(s) (default:orders-summary)" in self.stack.log("jobs"),
            f"run_jobs's scheduler did not read the schedule:\n{self.stack.log('jobs')}",
        )
        say("run_jobs started again (its scheduler reading the schedule), and runserver")

    def run(self) -> None:
        blocks = tutorial_blocks(self.tutorial)
        self.run_blocks(blocks)
        say(f"the tutorial's {len(blocks)} blocks ran as written, in a new project")

    def run_blocks(self, blocks: list[tuple[str, str, str]]) -> None:
        for tag, _, code in blocks:
            kind, _, argument = tag.partition(" ")
            if kind == "install":
                continue  # run_smoke.sh installed the wheel and the tutorial's additions
            if kind in ("write", "append"):
                target = self.shell.cwd / argument
                check(
                    kind == "write" or target.exists(), f"a block appends to {argument}, which does not exist"
                )
                text = target.read_text() + "\n\n" if kind == "append" else ""
                target.write_text(text + code + "\n")
            elif tag == "run development":
                self.run_development(code)
            elif tag == "run production":
                self.development_checks()
                self.run_production(code)
            elif tag == "run tasks":
                self.restart_jobs(code)
            elif tag == f"sh {BACKPORT}" and django_major() >= 6:
                check(not module_found("django_tasks"), "Django 6 has the django-tasks backport installed")
                say(
                    f"Django {django_major()}: the backport's pip line is for Django 5.2; django.tasks is Django's"
                )
            elif kind == "output":
                continue  # what a terminal shows: the checks around the blocks check it
            else:
                getattr(self, f"before_{argument.replace('-', '_')}", lambda: None)()
                output = self.shell.run(argument, code, until=self.until)
                getattr(self, f"after_{argument.replace('-', '_')}", lambda output: None)(output)

    # The checks between the tutorial's blocks: before_<name> and after_<name> of `sh <name>`.

    @property
    def base(self) -> str:
        return f"http://{self.shell.server}"

    def watch(self, job_id: str, on_frame=None) -> list[dict]:
        return watch_job(
            f"ws://{self.shell.server}/ws/jobs/{job_id}/", alice_cookie(), self.base, self.until, on_frame
        )

    def after_project(self, output: str) -> None:
        check(
            (self.shell.cwd / "manage.py").exists(),
            "after `cd mysite` the shell is not in the project's folder",
        )

    def after_order(self, output: str) -> None:
        self.django()
        from shop.models import Order

        first = headers_of(output)
        check(
            first[0].endswith("201 created") and "idempotent-replayed: true" not in first,
            f"the order: {output}",
        )
        again = self.shell.run("order", dict(self.blocks())["sh order"], until=self.until)
        check(
            headers_of(again)[0].endswith("201 created") and "idempotent-replayed: true" in headers_of(again),
            f"the order sent again: {again}",
        )
        check(again.split("\n\n", 1)[1:] == output.split("\n\n", 1)[1:], "the replay's body differs")
        check(Order.objects.count() == 1, f"{Order.objects.count()} orders after the order sent twice")
        say(
            "order: the keyed POST created order 1; sent again, replayed (Idempotent-Replayed: true), one order"
        )

    def blocks(self) -> list[tuple[str, str]]:
        return [(tag, code) for tag, _, code in tutorial_blocks(self.tutorial)]

    def before_refund(self) -> None:
        self.browser = open_page(self.base, alice_cookie(), until=self.until)
        self.refund_sent = time.monotonic()

    def after_refund(self, output: str) -> None:
        job_id = self.jobs["refund"] = self.shell.variable("JOB")
        check(json.loads(output)["job_id"] == job_id, f"GET /api/jobs/<id>/ answered {output}")
        if self.browser is not None:
            page_shows(self.browser, job_id, until=self.until)
            seen = time.monotonic() - self.refund_sent
            say(f"the open page showed the job started by curl {seen:.1f} s after the POST, without a reload")
        frames = self.watch(job_id)
        got = [(f.get("stage"), f.get("seq")) for f in frames]
        check(
            got == REFUND_EVENTS,
            f"the refund's socket got {got}, not {REFUND_EVENTS} (each once, in seq order)",
        )
        final = frames[-1]["data"]
        check(
            final.get("state") == "COMPLETED" and final.get("receipt"), f"the refund's final event: {final}"
        )
        token = self.shell.variable("TOKEN")
        wait_for(
            lambda: job_state(self.base, token, job_id).get("state") == "COMPLETED",
            until=self.until,
            what="the refund COMPLETED in GET /api/jobs/<id>/",
        )
        check(bank_refunds(f"{job_id}:pay") == 1, "the bank did not refund once under the pay stage's key")
        check_recorded(job_id, "refund")
        wait_for(
            lambda: "Subject: Refunded" in self.stack.log("jobs"),
            until=self.until,
            what="the refund's email in run_jobs's output (the worker's console email backend)",
        )
        say(
            f"refund: events {[seq for _, seq in got]} over the WebSocket, each once; COMPLETED, paid once, "
            f"recorded once (atomic), mailed"
        )

    def before_cancel(self) -> None:
        job_id = self.jobs["hold"] = self.shell.variable("JOB")
        token = self.shell.variable("TOKEN")
        wait_for(
            lambda: stage_of(self.base, token, job_id, "hold")["state"] == "RUNNING",
            interval=0.3,  # the jobs API's throttle: 120 requests a minute
            until=self.until,
            what="the held refund's hold stage to start",
        )

    def after_cancel(self, output: str) -> None:
        job_id = self.jobs["hold"]
        check(json.loads(output).get("job_id", job_id) == job_id, f"the cancel answered {output}")
        final = final_of(self.watch(job_id))
        check(final.get("state") == "CANCELLED", f"the cancelled refund's final event: {final}")
        token = self.shell.variable("TOKEN")
        pay = stage_of(self.base, token, job_id, "pay")
        check(pay["state"] == "PENDING" and not pay["attempts"], f"the cancelled refund's pay stage: {pay}")
        check(bank_refunds(f"{job_id}:pay") == 0, "the cancelled refund paid")
        check_not_recorded(job_id, "cancelled refund")
        again = http("POST", f"{self.base}/api/jobs/{job_id}/cancel/", token=token)
        check(again[0] == 409, f"cancelling the ended job got {again[0]}, not 409: {again[2]}")
        say(
            "cancel: the hold stage stopped, the pay stage never started, CANCELLED with its final event; again: 409"
        )

    def before_retry(self) -> None:
        job_id = self.jobs["bank-down"] = self.shell.variable("JOB")
        token = self.shell.variable("TOKEN")
        wait_for(
            lambda: db_state(job_id) == "FAILED",
            until=self.until,
            what="the refund with the bank down to fail",
        )
        job = job_state(self.base, token, job_id)
        error = job.get("error") or {}
        check(
            error.get("stage") == "pay" and error.get("type") == "ConnectionError",
            f"the failed refund's error: {error}",
        )
        attempts = stage_of(self.base, token, job_id, "pay")["attempts"]
        check(attempts == 3, f"the pay stage ran {attempts} times with the bank down, not 3")
        check_not_recorded(job_id, "failed refund")

    def after_retry(self, output: str) -> None:
        first = self.jobs["bank-down"]
        retry = json.loads(output)
        new = self.jobs["retry"] = retry["job_id"]
        token = self.shell.variable("TOKEN")
        retry_of = job_state(self.base, token, new).get("retry_of")
        check(retry_of == first, f"the retry's retry_of is {retry_of}, not {first}")
        (key,) = re.findall(r"Idempotency-Key: ([^\"]+)", dict(self.blocks())["sh retry"])  # the block's own
        replay = http("POST", f"{self.base}/api/jobs/{first}/retry/", token=token, key=key)
        check(
            replay[0] == 201 and replay[2]["job_id"] == new, f"the retry sent again: {replay[0]} {replay[2]}"
        )
        other = http("POST", f"{self.base}/api/jobs/{first}/retry/", token=token, key=f"another-{key}")
        check(
            other[0] == 409 and isinstance(other[2], dict) and other[2].get("retried_by") == new,
            f"a second retry under another key got {other[0]} {other[2]}, not 409 with retried_by {new}",
        )
        frames = self.watch(new)
        final = final_of(frames)
        check(final.get("state") == "COMPLETED", f"the retried refund's final event: {final}")
        check(
            bank_refunds(f"{first}:pay") == 1, "the retried refund did not pay once under the first job's key"
        )
        check(bank_refunds(f"{new}:pay") == 0, "the retried refund paid under its own key")
        check_recorded(new, "retried refund")
        check(
            job_state(self.base, token, first).get("state") == "FAILED", "the first job is no longer FAILED"
        )
        say(
            f"retry: the failed refund retried (201, replayed; another key 409 retried_by), COMPLETED, "
            f"paid once under {first}:pay"
        )

    def before_crash(self) -> None:
        job_id = self.jobs["crash"] = self.shell.variable("JOB")
        token = self.shell.variable("TOKEN")
        wait_for(
            lambda: stage_of(self.base, token, job_id, "hold")["state"] == "RUNNING",
            interval=0.3,  # the jobs API's throttle: 120 requests a minute
            until=self.until,
            what="the slow refund's hold stage to start",
        )
        assert self.stack is not None
        self.mails_before = self.stack.log("jobs").count("Subject: Refunded")

    def after_crash(self, output: str) -> None:
        assert self.stack is not None
        wait_for(
            lambda: "worker    | exited (killed by SIGKILL)" in self.stack.log("jobs"),
            until=self.until,
            what="run_jobs to see its worker killed",
            stack=self.stack,
        )
        self.killed_at = time.monotonic()

    def before_resumed(self) -> None:
        job_id = self.jobs["crash"]
        wait_for(
            lambda: db_state(job_id) == "COMPLETED",
            until=self.until,
            what="the refund whose worker was killed to complete",
        )
        self.resumed_after = time.monotonic() - self.killed_at

    def after_resumed(self, output: str) -> None:
        assert self.stack is not None
        job_id = self.jobs["crash"]
        (expected,) = [code for tag, code in self.blocks() if tag == "output resumed"]
        check(output.strip() == expected.strip(), f"the resumed job's stages:\n{output}\nnot\n{expected}")
        log = self.stack.log("jobs")
        check(
            f"Job {job_id} (RUNNING) shows no sign of life" in log,
            "the sweep did not say it enqueued the job again",
        )
        check(re.search(r"^worker +\| started \(pid", log, re.M), "run_jobs did not start its worker again")
        check(bank_refunds(f"{job_id}:pay") == 1, "the resumed refund did not pay once")
        check_recorded(job_id, "resumed refund")
        frames = self.watch(job_id)
        final = final_of(frames)
        check(final.get("state") == "COMPLETED", f"the resumed refund's final event: {final}")
        got = [(f.get("stage"), f.get("seq")) for f in frames]
        check(got == REFUND_EVENTS, f"the resumed refund's socket got {got}, not {REFUND_EVENTS}")
        mails = self.stack.log("jobs").count("Subject: Refunded") - self.mails_before
        check(mails == 1, f"the resumed refund mailed {mails} times")
        say(
            f"crash: the worker killed mid-hold, started again by run_jobs, the job enqueued again by the "
            f"sweep and COMPLETED {self.resumed_after:.0f} s after the kill; check ran once, pay once, "
            f"record once, one mail"
        )

    # Django's tasks

    def after_backport(self, output: str) -> None:
        check(module_found("django_tasks"), "the backport's pip line did not install django_tasks")
        say("Django 5.2: the django-tasks backport installed by the tutorial's pip line")

    def before_export(self) -> None:
        self.browser = open_page(self.base, alice_cookie(), until=self.until)

    def after_export(self, output: str) -> None:
        from django.contrib.auth import get_user_model
        from shop.models import Order

        from eventbus.models import Job

        task_id = self.jobs["export"] = self.shell.variable("TASK")
        check(output.strip() == task_id, f"the export block printed {output!r}, not its task's id")
        alice = get_user_model().objects.get(username="alice")
        job = Job.objects.get(pk=task_id)
        check(
            job.domain == "task"
            and job.payload["task"] == "shop.tasks.export_orders"
            and job.payload["args"] == [alice.pk]
            and job.owner_id == alice.pk
            and job.idem_key == "export-1:1"
            and job.priority == 10,
            f"the export's job: {job.domain} {job.payload} owner {job.owner_id} key {job.idem_key!r} "
            f"priority {job.priority}",
        )
        if self.browser is not None:
            page_shows(self.browser, task_id, until=self.until)
            say("the open page showed the export's card, without a reload")
        (code,) = [code for tag, code in self.blocks() if tag == "sh export"]
        (key,) = re.findall(r"Idempotency-Key: ([^\"]+)", code)
        token = self.shell.variable("TOKEN")
        again = http("POST", f"{self.base}/orders/export/", token=token, key=key)
        check(
            again[0] == 202
            and again[2] == {"task_id": task_id}
            and again[1].get("Idempotent-Replayed") == "true",
            f"the export sent again: {again[0]} {again[2]}",
        )
        exports = Job.objects.filter(domain="task", owner=alice, idem_key__startswith="export-1:").count()
        check(exports == 1, f"{exports} export tasks after the keyed POST sent twice")
        frames = self.watch(task_id)
        final = final_of(frames)
        check(final.get("state") == "COMPLETED", f"the export's final event: {final}")
        progress = [f["data"].get("progress") for f in frames[:-1]]
        orders = Order.objects.filter(owner=alice).count()
        check(
            len(progress) == orders and all(f.get("stage") == "run" for f in frames[:-1]),
            f"the export reported {len(progress)} events for {orders} orders: {frames}",
        )
        check(progress == sorted(progress), f"the export's progress went back: {progress}")
        say(
            f"export: a keyed POST enqueued the task once (export-1:1, alice's, priority 10; the POST again "
            f"replayed it), {len(progress)} progress events over the WebSocket each once, COMPLETED"
        )

    def before_result(self) -> None:
        task_id = self.jobs["export"]
        wait_for(lambda: db_state(task_id) == "COMPLETED", until=self.until, what="the export to complete")

    def after_result(self, output: str) -> None:
        (expected,) = [code for tag, code in self.blocks() if tag == "output result"]
        check(
            output.strip() == expected.strip(),
            f"get_result in another process printed {output!r}, not {expected!r}",
        )
        say(f"result: get_result in another process (manage.py shell): {output.strip()}")

    def after_receipt(self, output: str) -> None:
        from django.utils import timezone

        from eventbus.models import Job

        task_id, status = output.split()
        check(status == "READY", f"the delayed receipt's status is {status}, not READY")
        job = Job.objects.get(pk=task_id)
        check(
            job.idem_key == "receipt-order-2:1" and job.owner_id is None and job.run_after is not None,
            f"the receipt's job: key {job.idem_key!r}, owner {job.owner_id}, run_after {job.run_after}",
        )
        (code,) = [code for tag, code in self.blocks() if tag == "sh receipt"]
        again = self.shell.run("receipt", code, until=self.until).split()
        check(again[0] == task_id, f"the keyed receipt enqueued again gave {again[0]}, not {task_id}")
        job.refresh_from_db()
        if timezone.now() < job.run_after:
            check(
                job.state == "PENDING" and job.enqueued_at is None,
                f"the receipt is {job.state}, enqueued at {job.enqueued_at}, before its run_after",
            )
        wait_for(
            lambda: db_state(task_id) == "COMPLETED", until=self.until, what="the delayed receipt to complete"
        )
        job.refresh_from_db()
        check(
            job.started_at >= job.run_after,
            f"the receipt started at {job.started_at}, before its run_after {job.run_after}",
        )
        late = (job.started_at - job.run_after).total_seconds()
        assert self.stack is not None
        wait_for(
            lambda: "Subject: Your receipt" in self.stack.log("jobs"),
            until=self.until,
            what="the receipt's email in run_jobs's output",
        )
        mails = self.stack.log("jobs").count("Subject: Your receipt")
        check(mails == 1, f"the receipt was mailed {mails} times")
        say(
            f"receipt: READY and unsent until its run_after, the same id enqueued again (receipt-order-2:1), "
            f"started {late:.1f} s after it by the sweeper, mailed once"
        )

    def check_schedule(self) -> None:
        """The schedule's ticks: enqueued by run_jobs's scheduler, keyed by their tick (whole
        multiples of its 15 s since the epoch), ownerless, and run."""
        from datetime import datetime

        from eventbus.models import Job

        def ticks():
            return list(
                Job.objects.filter(
                    domain="task", payload__task="shop.tasks.orders_summary", state="COMPLETED"
                )
            )

        done = wait_for(ticks, until=self.until, what="a tick of the schedule to run")
        for job in done:
            name, _, at = job.idem_key.partition(":")
            check(
                name == "orders-summary"
                and datetime.fromisoformat(at).timestamp() % 15 == 0
                and job.owner_id is None,
                f"a tick's job: key {job.idem_key!r}, owner {job.owner_id}",
            )
        assert self.stack is not None
        logged = self.stack.log("jobs").count("Schedule 'orders-summary': tick ")
        check(logged >= len(done), f"the scheduler logged {logged} ticks, {len(done)} ran")
        say(f"schedule: {len(done)} tick(s) enqueued by run_jobs's scheduler, keyed by their time, and run")

    def development_checks(self) -> None:
        """Before the tutorial stops runserver: its pages, and its WebSocket's replay."""
        self.check_schedule()
        check_page(self.dev, alice_cookie())
        job_id = self.jobs["refund"]
        frames = watch_job(
            f"ws://127.0.0.1:{self.dev_port}/ws/jobs/{job_id}/", alice_cookie(), self.dev, self.until
        )
        got = [(f.get("stage"), f.get("seq")) for f in frames]
        check(got == REFUND_EVENTS, f"runserver's WebSocket replayed {got}, not {REFUND_EVENTS}")
        say(f"runserver's WebSocket replays the refund's events from seq 0: {[seq for _, seq in got]}")

    # This test's own checks, beyond the tutorial's

    def own_checks(self) -> None:
        token, cookie = users()
        check_idempotency(self.web, token)
        check_stage_retry(self.web, token, self.root, self.until)
        check_admin(self.web, self.jobs["refund"])
        check_page(self.web, cookie)
        # The how-to that tests the tutorial's job type, run in its project as written.
        howto = self.tutorial.parent / "howto" / "test-job-types.md"
        blocks = BLOCK.findall(howto.read_text())
        check(
            len(blocks) == 2, f"{howto.name} has {len(blocks)} tagged blocks, not its test file and command"
        )
        self.run_blocks(blocks)
        say(f"{howto.name}: its shop/tests.py passes in the tutorial's project")
        check_jobs_at_once(self.web, self.until)
        appendonly = [str(path) for path in self.root.rglob("appendonlydir")]
        check(not appendonly, f"the tutorial left Redis's files in the project: {appendonly}")
        check(
            any(self.home.rglob("appendonlydir")),
            f"the tutorial's Redis wrote no append-only file in {self.home}",
        )
        say("the tutorial's Redis kept its append-only file outside the project")
        assert self.stack is not None
        self.stack.check_alive()


def users():
    """This test's own user (not staff), their DRF token and a logged-in session cookie."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client
    from rest_framework.authtoken.models import Token

    user = get_user_model().objects.create_user("smoke", password=uuid.uuid4().hex, email="smoke@example.com")
    token = Token.objects.create(user=user).key
    client = Client()
    client.force_login(user)  # a session in the database, as the login view makes it
    return token, f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def check_jobs_at_once(base: str, until: float) -> None:
    """Keyed POST /api/jobs/ from several users at once, on the tutorial's SQLite: each gets its
    job (201), none a 503 for a database busy with the others."""
    from concurrent.futures import ThreadPoolExecutor

    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token
    from shop.models import Order

    requests = []
    for number in range(USERS_AT_ONCE):
        user = get_user_model().objects.create_user(f"buyer-{number}", email=f"buyer-{number}@example.com")
        token = Token.objects.create(user=user).key
        for each in range(POSTS_EACH):
            order = Order.objects.create(owner=user, sku="Z", total=Decimal("1.00"))
            requests.append((token, f"at-once-{number}-{each}", order.pk))

    def post(request):
        token, key, order = request
        return http(
            "POST",
            f"{base}/api/jobs/",
            token=token,
            key=key,
            body={"domain": "refund", "payload": {"order": order}},
        )

    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(post, requests))
    wrong = [f"{status} {body}" for status, _, body in answers if status not in (200, 201)]
    check(
        not wrong,
        f"{len(wrong)} of {len(requests)} keyed POST /api/jobs/ at once failed:\n  " + "\n  ".join(wrong),
    )
    say(f"{len(requests)} keyed POST /api/jobs/ from {USERS_AT_ONCE} users at once on SQLite: all 201")


def open_page(base: str, cookie: str, *, until: float) -> subprocess.Popen | None:
    """The page, open in chromium (tests/smoke/browser.py, run by the repository's Python, which
    has Playwright); None, said plainly, where that cannot run (CI must run it)."""
    python = os.environ.get("SMOKE_BROWSER_PYTHON", "")
    script = Path(__file__).with_name("browser.py")
    missing = None
    if not python or not Path(python).exists():
        missing = "no SMOKE_BROWSER_PYTHON (the repository's interpreter, with Playwright)"
    elif not (shutil.which("chromium") or Path("/usr/bin/chromium").exists()):
        missing = "no chromium"
    elif subprocess.run([python, "-c", "import playwright"], capture_output=True, check=False).returncode:
        missing = f"{python} has no Playwright"
    if missing:
        check(not os.environ.get("CI"), f"the page's browser check cannot run on CI: {missing}")
        say(f"SKIPPED the page's browser check: {missing}")
        return None
    name, _, value = cookie.partition("=")
    browser = subprocess.Popen(
        [python, str(script), base, name, value],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert browser.stdout is not None
    line = browser.stdout.readline().strip()
    check(line == "ready", f"the browser did not open the page: {line!r} (exit {browser.poll()})")
    return browser


def page_shows(browser: subprocess.Popen, job_id: str, *, until: float) -> None:
    """The open page shows the job's card (the browser waits up to 10 s for it)."""
    assert browser.stdin is not None and browser.stdout is not None
    browser.stdin.write(job_id + "\n")
    browser.stdin.flush()
    answer = browser.stdout.readline().strip()
    browser.wait(max(1, until - time.monotonic()))
    check(
        answer.startswith("seen"),
        f"the open page did not show the job started by curl, without a reload: {answer!r}",
    )


def check_idempotency(base: str, token: str) -> None:
    from shop.models import Order

    before = Order.objects.count()
    key = f"smoke-order-{uuid.uuid4()}"
    status, _, body = http("POST", f"{base}/orders/", token=token, body={"sku": "A1", "total": "1.00"})
    check(status == 400, f"a POST without a key to a 'required' view got {status}, not 400: {body}")
    first = http("POST", f"{base}/orders/", token=token, body={"sku": "A1", "total": "1.00"}, key=key)
    check(first[0] == 201, f"the keyed POST got {first[0]}: {first[2]}")
    again = http("POST", f"{base}/orders/", token=token, body={"sku": "A1", "total": "1.00"}, key=key)
    check(again[0] == 201 and again[2] == first[2], f"the retry got {again[0]} {again[2]}, not {first[2]}")
    check(again[1].get("Idempotent-Replayed") == "true", "the retry has no 'Idempotent-Replayed: true'")
    other = http("POST", f"{base}/orders/", token=token, body={"sku": "B2", "total": "1.00"}, key=key)
    check(other[0] == 422, f"the same key with another body got {other[0]}, not 422")
    check(
        Order.objects.count() == before + 1,
        "a keyed POST, its retry and another body made more than one order",
    )
    say("idempotency on daphne: no key 400, a keyed POST once, its retry replayed, another body 422")


def check_stage_retry(base: str, token: str, root: Path, until: float) -> None:
    """The bank answers 503 once: the pay stage runs again after its backoff, under the same key,
    and the refund completes; its watcher sees each event once."""
    from django.contrib.auth import get_user_model
    from shop.models import Order

    owner = get_user_model().objects.get(username="smoke")
    order = Order.objects.create(owner=owner, sku="R1", total=Decimal("3.00"))
    down = root / "bank-down"
    down.touch()
    status, _, job = http(
        "POST",
        f"{base}/api/jobs/",
        token=token,
        key=f"smoke-refund-{uuid.uuid4()}",
        body={"domain": "refund", "payload": {"order": order.pk}},
    )
    check(status == 201, f"POST /api/jobs/ for a refund got {status}: {job}")
    job_id = job["job_id"]

    def retrying():
        pay = stage_of(base, token, job_id, "pay")
        return pay["state"] == "RETRYING" and pay["attempts"] == 1

    wait_for(retrying, until=until, what="the pay stage to wait for its retry")
    down.unlink()
    admin_cookie = alice_cookie()
    frames = watch_job(f"ws://{base.split('//', 1)[1]}/ws/jobs/{job_id}/", admin_cookie, base, until)
    got = [(f.get("stage"), f.get("seq")) for f in frames]
    check(got == REFUND_EVENTS, f"the retried stage's socket got {got}, not {REFUND_EVENTS}")
    check(frames[-1]["data"].get("state") == "COMPLETED", f"the retried stage's job ended {frames[-1]}")
    attempts = stage_of(base, token, job_id, "pay")["attempts"]
    check(attempts == 2, f"the jobs API says the pay stage ran {attempts} times, not 2")
    check(bank_refunds(f"{job_id}:pay") == 1, "the bank did not refund once under the pay stage's key")
    check_recorded(job_id, "retried stage's refund")
    say("stage retry: the bank's 503 once, pay ran again after its backoff with the same key; COMPLETED")


def job_admin_url(job_id: str) -> str:
    """The admin page of a job: the change view of eventbus's Job."""
    from django.urls import reverse

    return reverse("admin:eventbus_job_change", args=[job_id])


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
    status, _, page = http("GET", f"{base}{job_admin_url(job_id)}", cookie=cookie)
    check(
        status == 200 and "<th>next attempt</th>" in page, f"a job's admin page got {status}: {page[:2000]}"
    )
    status, _, page = http("GET", f"{base}/admin/eventbus/deadletter/", cookie=cookie)
    check(
        status == 200 and "refund: 0 dead letters" in page,
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
        f"{base}: the gateway's page, its login page and the admin's render; the {page_assets}, {login_assets} "
        f"and {admin_assets} scripts, style sheets and icons they reference answer 200 with their types"
    )


def run_tutorial(tutorial: Path, work: Path, redis_server: str, timeout: float) -> None:
    tutorial_run = Tutorial(tutorial, work, redis_server, time.monotonic() + timeout)
    try:
        tutorial_run.run()
        tutorial_run.own_checks()
    except BaseException:
        if tutorial_run.stack is not None:
            tutorial_run.stack.stop()
            tutorial_run.stack.dump_logs()
        raise
    assert tutorial_run.stack is not None
    tutorial_run.stack.stop()


def _stopped(signum, frame):
    raise SmokeFailure(f"stopped by signal {signum} (run_smoke.sh's time limit?)")


def main(argv: list[str]) -> int:
    # `timeout` (run_smoke.sh) sends SIGTERM: unwind through the clean-ups, which stop the stack.
    signal.signal(signal.SIGTERM, _stopped)
    try:
        if argv[:1] == ["wheel"] and len(argv) == 2:
            check_wheel(Path(argv[1]))
        elif argv[:1] == ["requirements"] and len(argv) == 2:
            print("\n".join(tutorial_requirements(Path(argv[1]))))
        elif argv[:1] == ["tutorial"] and len(argv) == 3:
            started = time.monotonic()
            run_tutorial(
                Path(argv[1]),
                Path(argv[2]),
                os.environ.get("SMOKE_REDIS_SERVER") or "redis-server",
                float(os.environ.get("SMOKE_TIMEOUT", "240")),
            )
            say(f"PASSED in {time.monotonic() - started:.0f} s (the tutorial and the checks)")
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except SmokeFailure as failure:
        print(f"smoke: FAILED: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
