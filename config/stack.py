"""`make run`: migrate, ensure the demo user (printing its password and API token), start a
private Redis unless REDIS_URL is set, then run the Procfile with honcho. Ctrl-C stops every
process cleanly, the private Redis last; Ctrl-C again stops them at once.

    python -m config.stack

RUN_DIR (default .run/, mode 0700) holds the private Redis's data and config file (with its
password, new at each start), the demo password and the metrics files: every process of the Procfile writes its Prometheus values to RUN_DIR/metrics
(PROMETHEUS_MULTIPROC_DIR, emptied at each start) and /metrics adds them up.

How a stop goes. honcho runs in a session of its own, so a Ctrl-C at the terminal (SIGINT to the
whole foreground process group) reaches this process only, which passes one signal on to honcho.
honcho then sends SIGTERM to each program itself and waits for them. Not to each program's process
group, as honcho's own `terminate` does: a Celery worker's group holds its prefork pool, whose
processes would die under their jobs while the worker does its warm shutdown (WorkerLostError
tracebacks, jobs cut short). The worker stops its pool itself once the jobs in hand are done.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from eventbus.redis.redaction import masked_url

if TYPE_CHECKING:
    from config.redis_server import RedisServer

BASE_DIR = Path(__file__).resolve().parent.parent
# How long honcho waits for the programs after SIGTERM before it kills them: Celery's warm
# shutdown finishes the jobs in hand first (honcho's own 5 s cut running jobs short).
STOP_GRACE_SECONDS = 60
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
    env = dict(os.environ)
    # The Procfile's commands (uvicorn, celery) live next to this interpreter.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("WEB_PORT", "8000")
    run_dir = Path(os.environ.get("RUN_DIR") or BASE_DIR / ".run")

    from config.private_files import private_dir
    from config.redis_server import env_or_private
    from config.redis_server_check import RedisServerUnavailable

    private_dir(run_dir)
    try:
        redis_url, server = env_or_private(run_dir / "redis")
    except RedisServerUnavailable as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 1
    env["REDIS_URL"] = redis_url
    manage = [sys.executable, str(BASE_DIR / "manage.py")]
    try:
        subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, check=True)
        # Its credentials are printed as they come; its token goes into the banner's commands.
        demo = subprocess.run(
            [*manage, "ensure_demo_user"], env=env, check=True, stdout=subprocess.PIPE, text=True
        )
        print(demo.stdout, end="", flush=True)
        token = re.search(r"API token: (\S+)", demo.stdout)
        host = f"http://127.0.0.1:{env['WEB_PORT']}"
        print(banner(host, token.group(1) if token else "<API token>", redis_url, server), flush=True)
        return run_procfile({**env, "PROMETHEUS_MULTIPROC_DIR": str(fresh_dir(run_dir / "metrics"))})
    except subprocess.CalledProcessError as exc:
        return exc.returncode
    except KeyboardInterrupt:  # before the processes started: nothing to stop but Redis
        return 130
    finally:
        if server:
            server.stop()


def banner(host: str, token: str, redis_url: str, server: RedisServer | None) -> str:
    """Where to look, with commands that work as printed (the virtualenv's python, a POST that
    starts a job: /api/jobs/ answers GET with 405); the Redis password masked."""
    python = Path(sys.executable)
    if python.is_relative_to(Path.cwd()):
        python = python.relative_to(Path.cwd())
    auth = f'-H "Authorization: Token {token}"'
    where = (
        f" (private, stopped on exit; its password in {server.data_dir / server.CONFIG_FILE})"
        if server
        else ""
    )
    return (
        f"\n  Page:     {host}/\n"
        f"  API:      curl -X POST {host}/api/jobs/ {auth} -H 'Idempotency-Key: banner-1'"
        """ -H 'Content-Type: application/json' -d '{"domain": "scan", "payload": {}}'\n"""
        f"            curl {auth} {host}/api/jobs/<job_id>/\n"
        f"  Admin:    {host}/admin/ (a staff account: DJANGO_SETTINGS_MODULE=config.settings.dev"
        f" {python} manage.py createsuperuser)\n"
        f"  Metrics:  {host}/metrics (answers this machine only, unless METRICS_TOKEN is set)\n"
        f"  Redis:    {masked_url(redis_url)}{where}\n"
        "  Ctrl-C stops everything.\n"
    )


def fresh_dir(path: Path) -> Path:
    """An empty directory: metrics files of an earlier run (other pids) would add up with ours."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def run_procfile(env: dict) -> int:
    """honcho in its own session, sent one signal per signal we get; its exit code."""
    honcho: subprocess.Popen | None = None
    early: list[int] = []

    def forward(signum, frame):
        # SIGHUP (the terminal closed) would not reach honcho in its session: a stop too.
        signum = signal.SIGTERM if signum == signal.SIGHUP else signum
        if honcho is None:
            early.append(signum)  # honcho is starting: it gets it once it runs
        else:
            honcho.send_signal(signum)

    # Installed first, and kept until we exit: a signal while the private Redis stops goes to the
    # exited honcho, a no-op.
    for signum in FORWARDED:
        signal.signal(signum, forward)
    honcho = subprocess.Popen(
        [sys.executable, "-m", "config.stack", "honcho", "start", "-f", str(BASE_DIR / "Procfile")],
        env=env,
        cwd=BASE_DIR,
        start_new_session=True,
    )
    for pending in early:
        honcho.send_signal(pending)
    return honcho.wait()


def honcho_main(argv: list[str]) -> None:
    """honcho's command line with a supervisor's stop: SIGTERM to each program, not to its process
    group; STOP_GRACE_SECONDS before SIGKILL, or at once on a second signal; exit 0 when a stop
    asked for by a signal ended with every program exiting cleanly."""
    import honcho.command
    import honcho.manager

    class ProgramsOnly(honcho.manager.ProcessManager):
        def terminate(self, pid):
            # The Procfile's `exec` makes the pid the program itself.
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    class Manager(honcho.manager.Manager):
        stop_requested = False

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._procmgr = ProgramsOnly()

        def _start(self):
            # loop() installed honcho's handlers just before this; ours count the signals.
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, self._on_signal)
            super()._start()

        def _on_signal(self, signum, frame):
            self._system_print(f"{signal.Signals(signum).name} received\n")
            if self.stop_requested:  # asked again: no more waiting
                self.kill()
            self.stop_requested = True
            self.terminate()

        def loop(self):
            super().loop()
            if self.stop_requested:
                # -SIGTERM: stopped by our SIGTERM before it set up its own handler, still clean.
                clean = all(p.get("returncode") in (0, -signal.SIGTERM) for p in self._processes.values())
                self.returncode = 0 if clean else 1

    honcho.manager.KILL_WAIT = STOP_GRACE_SECONDS
    honcho.command.Manager = Manager
    honcho.command.main(argv)


if __name__ == "__main__":
    if sys.argv[1:2] == ["honcho"]:
        honcho_main(sys.argv[2:])
    else:
        sys.exit(main())
