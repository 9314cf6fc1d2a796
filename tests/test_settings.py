"""The settings modules as they load in a process of their own: production passes `check
--deploy` with no warning (as .ci/run checks it), its HTTPS settings come from the environment
with safe defaults, and DEBUG is on in config.settings.dev only."""

import json
import os
import secrets
import subprocess
import sys

import pytest

from tests.processes import BASE_DIR

pytestmark = pytest.mark.processes

PRODUCTION = {"ALLOWED_HOSTS": "example.com", "REDIS_URL": "redis://:made-up@redis.example.com:6379/0"}
HTTPS_SETTINGS = (
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SECURE_PROXY_SSL_HEADER",
    "SILENCED_SYSTEM_CHECKS",
)


def environment(**extra: str) -> dict:
    """This environment less the variables under test, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in (*HTTPS_SETTINGS, "BEHIND_TLS_PROXY")}
    env.pop("DJANGO_SECRET_KEY", None)
    return {**env, "DJANGO_SECRET_KEY": secrets.token_urlsafe(50), **extra}


def loaded(module: str, names: tuple[str, ...], **env: str) -> dict:
    """These settings of `module`, as a process that loads it sees them."""
    code = (
        "import json; from django.conf import settings; "
        f"print(json.dumps({{n: getattr(settings, n, None) for n in {list(names)!r}}}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=BASE_DIR,
        env=environment(DJANGO_SETTINGS_MODULE=module, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_production_passes_check_deploy_without_a_warning():
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=BASE_DIR,
        env=environment(DJANGO_SETTINGS_MODULE="config.settings.production", **PRODUCTION),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_production_https_defaults_are_safe():
    found = loaded("config.settings.production", HTTPS_SETTINGS, **PRODUCTION)
    assert found["SECURE_SSL_REDIRECT"] is True
    assert found["SECURE_HSTS_SECONDS"] == 31536000
    assert found["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is False and found["SECURE_HSTS_PRELOAD"] is False
    # Without a TLS proxy in front, any client could send X-Forwarded-Proto: https.
    assert found["SECURE_PROXY_SSL_HEADER"] is None
    assert set(found["SILENCED_SYSTEM_CHECKS"]) == {"security.W005", "security.W021"}


def test_production_https_settings_follow_the_environment():
    found = loaded(
        "config.settings.production",
        HTTPS_SETTINGS,
        **PRODUCTION,
        SECURE_SSL_REDIRECT="0",
        SECURE_HSTS_SECONDS="600",
        SECURE_HSTS_INCLUDE_SUBDOMAINS="1",
        SECURE_HSTS_PRELOAD="true",
        BEHIND_TLS_PROXY="1",
    )
    assert found["SECURE_SSL_REDIRECT"] is False and found["SECURE_HSTS_SECONDS"] == 600
    assert found["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is True and found["SECURE_HSTS_PRELOAD"] is True
    assert found["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert found["SILENCED_SYSTEM_CHECKS"] == []


@pytest.mark.parametrize(
    "module, debug",
    [("config.settings.dev", True), ("config.settings.test", False), ("config.settings.production", False)],
)
def test_debug_is_on_in_dev_settings_only(module, debug):
    assert loaded(module, ("DEBUG",), **PRODUCTION if "production" in module else {})["DEBUG"] is debug


def test_a_test_run_leaves_no_sqlite_files_in_run_dir(tmp_path):
    """The per-run test database goes, and its -wal and -shm files with it (tests/conftest.py),
    even when a thread left its connection open."""
    if os.environ.get("DATABASE_URL", "sqlite").split(":", 1)[0] != "sqlite":
        pytest.skip("the suite runs on another database than SQLite")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/sqlite_open_connection.py",
        ],
        cwd=BASE_DIR,
        env={**os.environ, "RUN_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("test-")) == []


@pytest.mark.parametrize(
    "command",
    [
        ["manage.py", "check"],
        ["-c", "import config.asgi"],
    ],
    ids=["manage.py", "asgi"],
)
def test_no_entry_point_chooses_settings_for_you(command):
    """manage.py ran on the dev settings (DEBUG on, a public SECRET_KEY) without
    DJANGO_SETTINGS_MODULE, while the server took production's: one rule now, each refuses,
    naming the variable, even with every production variable set (the Celery worker: below)."""
    env = environment(**PRODUCTION)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, *command], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0, done.stdout
    assert "DJANGO_SETTINGS_MODULE" in done.stderr
    assert "System check identified" not in done.stdout


def test_production_refuses_to_start_without_its_redis_url():
    """Without REDIS_URL the bus, the cache and the broker fell back to an unauthenticated
    127.0.0.1:6379."""
    env = environment(DJANGO_SETTINGS_MODULE="config.settings.production", **PRODUCTION)
    del env["REDIS_URL"]
    code = "from django.conf import settings; print(settings.REDIS_URL)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and "REDIS_URL" in done.stderr
    env["REDIS_URL"] = PRODUCTION["REDIS_URL"]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == PRODUCTION["REDIS_URL"], done.stderr


def test_a_worker_started_without_settings_refuses_to_start():
    """`celery -A config worker` without DJANGO_SETTINGS_MODULE: Django's clear refusal, not the
    dev settings (DEBUG on, a public SECRET_KEY)."""
    env = environment()
    env.pop("DJANGO_SETTINGS_MODULE", None)
    code = "import config.celery; from django.conf import settings; print(settings.DEBUG)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and "DJANGO_SETTINGS_MODULE" in done.stderr
