"""`make run`: migrate, ensure the demo user, start a private Redis unless REDIS_URL is set,
then run the Procfile with honcho. Ctrl-C stops every process, the private Redis last.

    python -m config.stack
"""
import os
import signal
import subprocess
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
    env = dict(os.environ)
    # The Procfile's commands (daphne, celery) live next to this interpreter.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("WEB_PORT", "8000")

    from config.redis_server import env_or_private

    redis_url, server = env_or_private(BASE_DIR / ".run" / "redis")
    env["REDIS_URL"] = redis_url
    manage = [sys.executable, str(BASE_DIR / "manage.py")]
    try:
        subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, check=True)
        subprocess.run([*manage, "ensure_demo_user"], env=env, check=True)
        host = f"http://127.0.0.1:{env['WEB_PORT']}"
        print(
            f"\n  Page:     {host}/\n  API:      {host}/api/jobs/\n  Admin:    {host}/admin/"
            f" (python manage.py createsuperuser for a staff account)\n  Metrics:  {host}/metrics\n"
            f"  Redis:    {redis_url}{' (private, stopped on exit)' if server else ''}\n"
            "  Ctrl-C stops everything.\n",
            flush=True,
        )
        honcho = subprocess.Popen(
            [sys.executable, "-m", "honcho", "start", "-f", str(BASE_DIR / "Procfile")], env=env, cwd=BASE_DIR
        )
        while True:
            try:
                return honcho.wait()
            except KeyboardInterrupt:
                # honcho received the same Ctrl-C and is stopping its processes; wait for it.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
    except subprocess.CalledProcessError as exc:
        return exc.returncode
    finally:
        if server:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
