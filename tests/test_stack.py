"""`make run` as a new user meets it: `python -m config.stack` started for real in a directory of its
own (RUN_DIR, a SQLite file, its private Redis, a free WEB_PORT). The token it prints works with
the documented curl as written (the jobs API's page, docs/reference/http-api.md, and the README's
quick start), and so do the page's cancel and retry curls; /metrics shows every process's
metrics; Ctrl-C, sent to the process group as a terminal sends it, stops everything cleanly, the
private Redis last.

Also /metrics against metrics files written by another process (a router), the multiprocess mode
the stack runs in."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import redis

from config.redis_server import free_port
from tests.processes import BASE_DIR, Manage, pids_with_env, pids_working_in, run_command, wait_for

BANNER = "Ctrl-C stops everything."
# What each process of the Procfile logs once it is up (signal handlers in place).
READY = {
    "web": r"Uvicorn running on",
    "worker": r"celery@\S+ ready\.",
    "sweeper": r"Sweeping every",
    "scheduler": r"Scheduling \d+ schedule\(s\)",
    "router": r"eventbus\.bus\.router router ",
    "reclaimer": r"reclaimer: \d+ entries claimed",
}


def found(pattern: str, text: str, flags: int = 0) -> str:
    """The first group of `pattern` in `text`; a clear failure when it is not there."""
    match = re.search(pattern, text, flags)
    assert match is not None, f"{pattern!r} not found in:\n{text[-2000:]}"
    return match.group(1)


class Stack:
    """`python -m config.stack` in a session of its own, as a terminal's foreground job."""

    def __init__(self, root: Path):
        self.root = root
        self.run_dir = root / "run"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.starts = 0
        # Nothing of the test run's: the stack starts its own Redis and database, and picks its settings.
        env = {
            k: v
            for k, v in os.environ.items()
            if k
            not in (
                "REDIS_URL",
                "CELERY_BROKER_URL",
                "CACHE_URL",
                "TEST_DATABASE_NAME",
                "PROMETHEUS_MULTIPROC_DIR",
                "prometheus_multiproc_dir",
                # As `make run` runs it: the stack chooses its own settings (dev).
                "DJANGO_SETTINGS_MODULE",
            )
        }
        env.update(
            RUN_DIR=str(self.run_dir),
            DATABASE_URL=f"sqlite:///{root / 'db.sqlite3'}",
            WEB_PORT=str(self.port),
            PYTHONUNBUFFERED="1",
        )
        self.env = env
        self.process: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        """This start's log (a restart writes a new one, so the ready lines are its own)."""
        return self.root / f"stack-{self.starts}.log"

    def start(self) -> Stack:
        self.starts += 1
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "config.stack"],
                cwd=BASE_DIR,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(
            lambda: BANNER in self.log() or self.process.poll() is not None,
            timeout=60,
            interval=0.2,
            message="the banner",
        )
        assert self.process.poll() is None, self.log()
        wait_for(
            lambda: self.ready() or self.process.poll() is not None,
            timeout=90,
            interval=0.2,
            message="every process of the Procfile",
        )
        assert self.process.poll() is None, self.log()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def ready(self) -> bool:
        log = self.log()
        return all(re.search(rf"{name}\.1 +\| .*{text}", log) for name, text in READY.items())

    def redis_port(self) -> int:
        return int(found(r"Redis:\s+redis://:\*\*\*@127\.0\.0\.1:(\d+)/0 \(private", self.log()))

    def redis_password(self) -> str:
        """The private Redis's password, where the banner says it is (never in the banner)."""
        return found(r"^requirepass (\S+)$", (self.run_dir / "redis" / "redis.conf").read_text(), re.M)

    def redis_url(self) -> str:
        return f"redis://:{self.redis_password()}@127.0.0.1:{self.redis_port()}/0"

    def manage(self, *args: str, **env: str) -> str:
        """`manage.py <args>` on this stack's database: its output."""
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=BASE_DIR,
            # As a developer runs it: manage.py chooses no settings (config.entrypoints).
            env={**self.env, "DJANGO_SETTINGS_MODULE": "config.settings.dev", **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout

    def interrupt(self) -> None:
        """Ctrl-C at a terminal: SIGINT to every process of the foreground process group."""
        assert self.process is not None, "not started"
        os.killpg(self.process.pid, signal.SIGINT)

    def cleanup(self) -> None:
        """Whatever is left of this stack stopped: a Ctrl-C first (the stack stops its Redis itself),
        then SIGKILL for every process still carrying our RUN_DIR or working in it (its Redis)."""
        if self.process and self.process.poll() is None:
            try:
                self.interrupt()
                self.process.wait(timeout=90)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.power_cut()

    def power_cut(self) -> None:
        """Every process of this stack SIGKILLed at once, its Redis included: nothing stops cleanly."""
        if self.process and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=10)
        for pid in {*pids_with_env("RUN_DIR", str(self.run_dir)), *pids_working_in(self.run_dir)}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for(
            lambda: not pids_with_env("RUN_DIR", str(self.run_dir)) and not pids_working_in(self.run_dir),
            timeout=10,
            message="no process of the stack left",
        )


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """One stack for the module's tests; the Ctrl-C test stops it, so it comes last."""
    stack = Stack(tmp_path_factory.mktemp("stack"))
    try:
        yield stack.start()
    finally:
        stack.cleanup()


def token_of(stack) -> str:
    """The token as the documentation says to get it."""
    return stack.manage("ensure_demo_user", "--token").strip()


def drf_token(stack) -> str:
    """The demo user's token from DRF's own command: for the tests of other things than the banner."""
    out = stack.manage("drf_create_token", "demo")
    return found(r"Generated token (\w+) for user demo", out)


def start_job(stack, token: str) -> dict:
    request = urllib.request.Request(
        f"{stack.url}/api/jobs/",
        method="POST",
        data=json.dumps({"domain": "scan", "payload": {}}).encode(),
        headers={
            "Authorization": f"Token {token}",
            "Idempotency-Key": os.urandom(8).hex(),
            "Content-Type": "application/json",
        },
    )
    return json.loads(urllib.request.urlopen(request, timeout=10).read())


# The documentation's blocks tagged `<!-- run: sh-stack NAME -->` (tests/docs/blocks.py), by NAME:
# the test that runs them here.
STACK_BLOCKS = {"quick-start": "test_the_readme_token_and_curl_work_as_written"}


def stack_block(name: str) -> str:
    """The one text of the blocks tagged `sh-stack <name>`, on every page that shows it."""
    from tests.docs.blocks import all_blocks

    texts = {block.body for block in all_blocks() if block.kind == "sh-stack" and block.args == [name]}
    assert len(texts) == 1, f"the pages' sh-stack {name} blocks differ (or there is none): {texts}"
    return texts.pop()


def readme_example(stack) -> str:
    """The quick start's shell block (the README's and the jobs API's page's,
    docs/reference/http-api.md), as written, for this stack's port."""
    block = stack_block("quick-start")
    block = block.replace(".venv/bin/python", sys.executable)  # the virtualenv this test runs in
    return block.replace("127.0.0.1:8000", f"127.0.0.1:{stack.port}")


def api(stack, path: str, token: str) -> dict:
    request = urllib.request.Request(f"{stack.url}{path}", headers={"Authorization": f"Token {token}"})
    return json.loads(urllib.request.urlopen(request, timeout=10).read())


def metric_sum(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{name}\{{[^}}]*{re.escape(labels)}[^}}]*\}} (\S+)$"
    return sum(float(v) for v in re.findall(pattern, text, re.M))


@pytest.mark.stack
def test_the_readme_token_and_curl_work_as_written(stack):
    assert shutil.which("curl"), "The documented example runs curl: apt-get install curl"
    token = token_of(stack)
    assert re.fullmatch(r"[0-9a-f]{40}", token), token
    assert f"API token: {token}" in stack.log()  # the banner shows the same one
    example = readme_example(stack)

    def run():  # the documented commands, in a shell, plus the answer's status and headers
        done = subprocess.run(
            ["bash", "-ec", example.rstrip() + " -sS -i"],
            cwd=BASE_DIR,
            env=stack.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (example, done.stdout, done.stderr)
        head, body = done.stdout.split("\n\n", 1)  # text mode: \r\n read as \n
        return head.lower(), json.loads(body)

    head, job = run()
    assert head.startswith("http/1.1 201"), (example, head, job)
    assert job["domain"] == "scan" and "idempotent-replayed" not in head
    head, again = run()  # the same command again: a replay, no second job
    assert head.startswith("http/1.1 201") and "idempotent-replayed: true" in head, head
    assert again == job


@pytest.mark.stack
def test_the_banners_commands_work_and_it_shows_no_password(stack):
    """The banner's curl starts a job as printed, its detail URL shows it; the private Redis wants
    the password the banner masks, which is nowhere in the output."""
    log = stack.log()
    password = stack.redis_password()
    assert password not in log
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=stack.redis_port(), socket_connect_timeout=2).ping()
    with redis.Redis.from_url(stack.redis_url(), socket_connect_timeout=2) as client:
        assert client.ping()
    assert found(
        r"Admin: .*DJANGO_SETTINGS_MODULE=config\.settings\.dev (\S+) manage\.py createsuperuser", log
    ).endswith("python")
    post = found(r"API: +(curl -X POST .*)$", log, re.M).replace("127.0.0.1:8000", f"127.0.0.1:{stack.port}")
    done = subprocess.run(["bash", "-ec", post + " -sS -i"], capture_output=True, text=True, timeout=60)
    head, body = done.stdout.split("\n\n", 1)
    assert head.lower().startswith("http/1.1 201"), (post, done.stdout, done.stderr)
    job_id = json.loads(body)["job_id"]
    detail = found(r"^ +(curl -H .*/api/jobs/<job_id>/)$", log, re.M).replace("<job_id>", job_id)
    done = subprocess.run(["bash", "-ec", detail + " -sS -f"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["job_id"] == job_id, (
        detail,
        done.stdout,
        done.stderr,
    )


def test_the_banner_masks_the_redis_password_and_names_the_virtualenvs_python(tmp_path):
    from config.redis_server import RedisServer
    from config.stack import banner

    server = RedisServer(data_dir=tmp_path / "redis", password="s3cret-pw")
    text = banner("http://127.0.0.1:8000", "tok", server.url, server)
    assert "s3cret-pw" not in text
    assert f"redis://:***@127.0.0.1:{server.port}/0 (private" in text
    assert str(tmp_path / "redis" / "redis.conf") in text
    assert (
        " python manage.py" not in text and f"{Path(sys.executable).name} manage.py createsuperuser" in text
    )
    assert 'curl -X POST http://127.0.0.1:8000/api/jobs/ -H "Authorization: Token tok"' in text
    external = banner("http://127.0.0.1:8000", "tok", "rediss://app:s3cret-pw@redis.example.com:6380/0", None)
    assert "s3cret-pw" not in external and "rediss://app:***@redis.example.com:6380/0" in external


@pytest.mark.stack
def test_metrics_show_every_process(stack):
    token = drf_token(stack)
    job = start_job(stack, token)
    wait_for(
        lambda: api(stack, f"/api/jobs/{job['job_id']}/", token)["state"] == "COMPLETED",
        timeout=60,
        interval=0.2,
        message="the job to complete",
    )

    def scraped():
        text = urllib.request.urlopen(f"{stack.url}/metrics", timeout=5).read().decode()
        # published by a worker's pool process, applied by the router, the request seen by the web server
        counts = (
            metric_sum(text, "eventbus_published_total"),
            metric_sum(text, "eventbus_applied_total"),
            metric_sum(text, "idempotency_requests_total", 'outcome="miss"'),
            # the job's end and its stages counted by the worker's pool, its POST by the web server
            metric_sum(text, "eventbus_jobs_ended_total", 'domain="scan",outcome="completed"'),
            metric_sum(text, "eventbus_stage_duration_seconds_count", 'outcome="completed"'),
            metric_sum(text, "http_requests_total", 'method="POST",status="2xx",view="job-list"'),
        )
        return counts if all(counts) else None

    published, applied, misses, ended, stages, posts = wait_for(
        scraped, timeout=30, interval=0.2, message="every process's metrics"
    )
    assert published >= 5 and applied >= 5 and misses >= 1
    assert ended >= 1 and posts >= 1 and stages >= 2  # the documented curl's test may have started a job too


@pytest.mark.stack
def test_the_cancel_and_retry_examples_work_as_written(stack):
    """The jobs API page's cancel and retry curls (tagged `curl`: tests/docs/ sends them through
    the test client too), run as written in a shell, with $TOKEN and $JOB set as the page says:
    a job cancelled, retried, and a second retry under another key refused with its retry named."""
    from tests.docs.blocks import blocks_of

    cancel, retry, again = [
        block for block in blocks_of(BASE_DIR / "docs" / "reference" / "http-api.md") if block.kind == "curl"
    ]
    token = drf_token(stack)
    job_id = start_job(stack, token)["job_id"]

    def run(block) -> tuple[int, dict]:
        script = block.body.rstrip().replace("127.0.0.1:8000", f"127.0.0.1:{stack.port}") + " -sS -i"
        done = subprocess.run(
            ["bash", "-ec", script],
            env={**stack.env, "TOKEN": token, "JOB": job_id},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (script, done.stdout, done.stderr)
        head, body = done.stdout.split("\n\n", 1)
        return int(head.split()[1]), json.loads(body)

    status, cancelled = run(cancel)
    assert status == 202 and cancelled["job_id"] == job_id, cancelled
    wait_for(
        lambda: api(stack, f"/api/jobs/{job_id}/", token)["state"] == "CANCELLED",
        timeout=30,
        interval=0.2,
        message="the job to end CANCELLED",
    )
    status, new = run(retry)
    assert status == 201 and new["retry_of"] == job_id, new
    status, refused = run(again)
    assert status == 409 and refused["retried_by"] == new["job_id"], refused


@pytest.mark.stack
def test_ctrl_c_stops_every_process_cleanly_and_redis_last(stack):
    redis_port = stack.redis_port()
    # A job in hand when Ctrl-C comes: the worker finishes it before it stops.
    job_id = start_job(stack, drf_token(stack))["job_id"]
    wait_for(
        lambda: f"Job {job_id} running" in stack.log(), timeout=30, interval=0.1, message="the job running"
    )
    stack.interrupt()
    try:
        code = stack.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the stack did not stop:\n{stack.log()[-5000:]}")
    log = stack.log()
    assert "Traceback" not in log, log
    assert "WorkerLostError" not in log, log
    for name in READY:
        # uvicorn shuts down gracefully, then exits by the SIGTERM it caught (its cooperative
        # signal handling): rc -15 after "Finished server process" is its clean stop.
        clean = ("(rc=0)", "(rc=-15)") if name == "web" else ("(rc=0)",)
        assert any(f"{name}.1 stopped {rc}" in log for rc in clean), (name, log)
    assert re.search(r"web\.1 +\| INFO: +Finished server process", log), log
    assert f"Job {job_id} COMPLETED" in log, log
    assert code == 0, log
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=redis_port, socket_connect_timeout=1).ping()
    wait_for(
        lambda: not pids_with_env("RUN_DIR", str(stack.run_dir)) and not pids_working_in(stack.run_dir),
        timeout=10,
        message="no process left",
    )


# Nothing stranded: a job whose run died with the stack completes after the next start.

SCAN_EVENTS = [["vision", 10], ["rule", 20], ["answer", 30], ["reward", 40], ["done", 51]]


@pytest.fixture
def own_stack(tmp_path):
    """A stack of the test's own, for tests that stop and start it."""
    stack = Stack(tmp_path)
    try:
        yield stack
    finally:
        stack.cleanup()


def cut_short(stack) -> tuple[str, str]:
    """Start the stack and a scan job; return once its first stage is recorded and the second
    runs (the stop comes mid-job): the job's id and a token."""
    stack.start()
    token = drf_token(stack)
    job_id = start_job(stack, token)["job_id"]
    wait_for(
        lambda: f"Job {job_id}: stage rule, attempt 1" in stack.log(),
        timeout=30,
        interval=0.1,
        message="the job's second stage",
    )
    return job_id, token


def completes_after_restart(stack, job_id: str, token: str) -> None:
    """The next start finishes the job, each of its events once in its stream, in order."""
    assert f"Job {job_id} COMPLETED" not in stack.log()
    stack.start()
    # dev settings: RECOVER_AFTER 20 s, and the sweeper's first pass comes at its start.
    wait_for(
        lambda: api(stack, f"/api/jobs/{job_id}/", token)["state"] == "COMPLETED",
        timeout=90,
        interval=0.5,
        message=f"the job to complete after the restart:\n{stack.log()[-3000:]}",
    )
    assert re.search(rf"Job {job_id} \(RUNNING\) shows no sign of life .* enqueued again", stack.log())
    assert f"Job {job_id}: stage rule, attempt 2" in stack.log()  # resumed: vision not run again
    assert f"Job {job_id}: stage vision" not in stack.log()
    redis_url = stack.redis_url()
    events = stack.manage(
        "shell",
        "-c",
        "import json; from eventbus.redis.clients import get_redis; from tests.eventbus.helpers import job_events;"
        f" print(json.dumps(job_events(get_redis(), 'scan', '{job_id}')))",
        REDIS_URL=redis_url,
    )
    assert json.loads(events.strip().splitlines()[-1]) == SCAN_EVENTS


@pytest.mark.stack
def test_a_job_cut_short_by_ctrl_c_twice_completes_at_the_next_make_run(own_stack):
    job_id, token = cut_short(own_stack)
    own_stack.interrupt()  # Ctrl-C: the worker would finish the job first...
    time.sleep(0.5)
    own_stack.interrupt()  # ...Ctrl-C again: everything stops at once, the job cut short
    own_stack.process.wait(timeout=30)
    completes_after_restart(own_stack, job_id, token)


@pytest.mark.stack
def test_a_job_cut_short_by_a_power_cut_completes_after_the_redis_data_is_gone(own_stack):
    job_id, token = cut_short(own_stack)
    own_stack.power_cut()
    shutil.rmtree(own_stack.run_dir / "redis")  # broker message, run lease, streams: all gone
    completes_after_restart(own_stack, job_id, token)


# /metrics in multiprocess mode, against the files of processes started here.


def multiproc_files(directory: Path, pid: int) -> list[str]:
    return sorted(p.name for p in directory.glob(f"*_{pid}.db"))


def test_metrics_add_up_other_processes_and_drop_a_stopped_ones_gauges(
    transactional_db, client, redis_client, tmp_path, monkeypatch
):
    from eventbus import publish_events

    reports_lag = int(redis_client.info()["redis_version"].split(".")[0]) >= 7  # XINFO GROUPS lag

    directory = tmp_path / "metrics"
    directory.mkdir()
    port = free_port()
    # prometheus_client reads PROMETHEUS_MULTIPROC_DIR when first imported: the router has it from
    # its start; this test process (imported long ago) stays in single-process mode.
    router = Manage(
        "run_router",
        "--consumer",
        "metrics",
        "--block-ms",
        "200",
        "--metrics-port",
        str(port),
        PROMETHEUS_MULTIPROC_DIR=str(directory),
    ).start()
    try:
        publish_events(
            [
                ("scan", "m1", "vision", 10, {}),
                ("scan", "m1", "rule", 20, {}),
                ("chat", "m2", "answer", 30, {}),
            ]
        )

        def own_port_applied():
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            except OSError:  # not listening yet
                return False
            return metric_sum(text.decode(), "eventbus_applied_total") == 3

        wait_for(own_port_applied, timeout=30, interval=0.1, message="the router's --metrics-port")
        counted = run_command(
            "shell",
            "-c",
            "from idempotency import metrics; metrics.count('replay')",
            PROMETHEUS_MULTIPROC_DIR=str(directory),
        )
        assert counted[0] == 0, counted[1]

        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))  # read per request
        text = client.get("/metrics").content.decode()
        assert metric_sum(text, "eventbus_applied_total") == 3, text
        assert metric_sum(text, "idempotency_requests_total", 'outcome="replay"') == 1, text
        # This process's 3 published are not in the files.
        assert metric_sum(text, "eventbus_published_total") == 0, text
        if reports_lag:
            assert re.search(r"^eventbus_consumer_lag\{", text, re.M), text
            assert any(f.startswith("gauge_livemostrecent_") for f in multiproc_files(directory, router.pid))

        router.signal(signal.SIGTERM)
        assert router.wait() == 0, router.log()
    finally:
        router.kill()
        router.log_path.unlink(missing_ok=True)
    # Its counters still count; its gauge no longer stands for a live process.
    assert not any(name.startswith("gauge_live") for name in multiproc_files(directory, router.pid))
    text = client.get("/metrics").content.decode()
    assert metric_sum(text, "eventbus_applied_total") == 3, text
    assert not re.search(r"^eventbus_consumer_lag\{", text, re.M), text

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")  # unset: this process's own registry
    text = client.get("/metrics").content.decode()
    assert metric_sum(text, "eventbus_published_total") >= 3, text
