"""Secrets stay out of messages and out of other users' reach: URLs are shown with
their password masked, and the files that hold secrets are created 0600 in 0700 folders."""

import os
import stat
import sys

import pytest
from django.core.management import call_command

from config.private_files import private_dir, write_private_file
from eventbus.redis.redaction import masked_url
from eventbus.redis.sentinel import BadSentinelURL, parse_sentinel_url


@pytest.mark.parametrize(
    "url, shown",
    [
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("rediss://default:s3cret@redis.example.com:6380/1", "rediss://default:***@redis.example.com:6380/1"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://127.0.0.1:6379/0?password=s3cret&db=2", "redis://127.0.0.1:6379/0?password=***&db=2"),
        ("redis+sentinel://:s3cret@s1:26379,s2:26379/bus/0", "redis+sentinel://:***@s1:26379,s2:26379/bus/0"),
        # The sentinel form reads a userinfo without a colon as the password.
        ("redis+sentinel://s3cret@s1:26379/bus", "redis+sentinel://***@s1:26379/bus"),
        ("postgres://app:s3/cr@t@db.example.com:5432/app", "postgres://app:***@db.example.com:5432/app"),
        (
            "sentinel://:s3cret@s1:26379/0;sentinel://:s3cret@s2:26379/0",
            "sentinel://:***@s1:26379/0;sentinel://:***@s2:26379/0",
        ),
    ],
)
def test_masked_url_hides_the_password_and_keeps_the_rest(url, shown):
    assert masked_url(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://:s3cret@s1:port/bus",  # not host:port
        "redis+sentinel://:s3cret@s1:26379",  # no master name
        "redis+sentinel://:s3cret@s1:26379/bus/zero",  # the database not a number
    ],
)
def test_a_bad_sentinel_url_is_quoted_without_its_password(url):
    with pytest.raises(BadSentinelURL) as raised:
        parse_sentinel_url(url)
    assert "s3cret" not in str(raised.value)
    assert ":***@s1:" in str(raised.value)


def test_a_private_file_is_0600_and_its_folder_0700_whatever_the_umask(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir(mode=0o755)  # as an earlier version left .run/
    previous = os.umask(0)
    try:
        path = write_private_file(folder / "secret", "s3cret")
    finally:
        os.umask(previous)
    assert path.read_text() == "s3cret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    write_private_file(path, "another")  # replaced whole, still 0600, no temporary left behind
    assert path.read_text() == "another" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in folder.iterdir()] == ["secret"]
    assert stat.S_IMODE(private_dir(tmp_path / "a" / "b").stat().st_mode) == 0o700


def test_the_demo_password_file_is_created_0600_in_a_0700_run_dir(db, settings, tmp_path, capsys):
    settings.RUN_DIR = tmp_path / "run"
    previous = os.umask(0)  # what the folder and the file get is theirs, not the umask's
    try:
        call_command("ensure_demo_user")
    finally:
        os.umask(previous)
    secret = settings.RUN_DIR / "demo-password"
    assert stat.S_IMODE(settings.RUN_DIR.stat().st_mode) == 0o700
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert f"demo / {secret.read_text()}" in capsys.readouterr().out

    # What an earlier version left: a readable folder and file, closed at the next run.
    settings.RUN_DIR.chmod(0o755)
    secret.chmod(0o644)
    call_command("ensure_demo_user", "--token")
    assert stat.S_IMODE(settings.RUN_DIR.stat().st_mode) == 0o700
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_the_test_run_dir_is_private():
    from django.conf import settings

    assert stat.S_IMODE(settings.RUN_DIR.stat().st_mode) == 0o700


# Error reports: eventbus.reporting's exception reporter filter on Django's technical 500 page.
# The passwords are made at run time: the page shows the source lines around each frame too.
REPORTED = {
    name: f"{name}-{os.urandom(6).hex()}"
    for name in ("redis", "cache", "broker", "node", "query", "meta", "local")
}
REPORTER_FILTER = "eventbus.reporting.SafeExceptionReporterFilter"


def use_filter(settings, path: str) -> None:
    """DEFAULT_EXCEPTION_REPORTER_FILTER, in force now: Django caches the instance it made."""
    from django.views.debug import get_default_exception_reporter_filter

    settings.DEFAULT_EXCEPTION_REPORTER_FILTER = path
    get_default_exception_reporter_filter.cache_clear()  # type: ignore[attr-defined]


@pytest.fixture
def reporter_settings(settings):
    from django.views.debug import get_default_exception_reporter_filter

    secret_settings(settings)
    yield settings
    get_default_exception_reporter_filter.cache_clear()  # the next test's own settings'


def secret_settings(settings):
    pw = REPORTED
    settings.DEBUG = True
    settings.REDIS_URL = f"redis://:{pw['redis']}@10.0.0.1:6379/0"
    settings.CACHE_URL = f"rediss://cache:{pw['cache']}@10.0.0.2:6380/1"
    settings.CELERY_BROKER_URL = f"redis+sentinel://:{pw['broker']}@s0:26379,s1:26379/mymaster/0"
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": f"redis://:{pw['cache']}@10.0.0.2:6380/1",
            "OPTIONS": {"SENTINELS": [("s0", 26379)], "NODES": [f"redis://u:{pw['node']}@s0:26379/0"]},
        }
    }
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {
        "sentinel_kwargs": {"url": f"redis://10.0.0.3:6379/0?password={pw['query']}&db=0"},
    }


def error_page(accept: str) -> str:
    from django.test import RequestFactory
    from django.views.debug import technical_500_response

    upstream = f"redis://:{REPORTED['meta']}@up:6379/0"
    request = RequestFactory().get("/boom/", HTTP_ACCEPT=accept, HTTP_X_UPSTREAM=upstream)
    request.META["REDIS_URL"] = upstream  # the process's environment, as WSGI puts it in META
    try:
        local_url = f"redis://:{REPORTED['local']}@10.0.0.9:6379/0"  # noqa: F841  (a frame variable)
        raise RuntimeError("boom")
    except RuntimeError:
        response = technical_500_response(request, *sys.exc_info())
    return response.content.decode()


@pytest.mark.parametrize("accept", ["text/html", "text/plain"], ids=["html", "text"])
def test_the_technical_500_page_shows_no_url_password(reporter_settings, accept):
    use_filter(reporter_settings, REPORTER_FILTER)
    page = error_page(accept)
    assert "REDIS_URL" in page and "10.0.0.1:6379" in page and "CELERY_BROKER_TRANSPORT_OPTIONS" in page
    for password in REPORTED.values():
        assert password not in page, password


def test_djangos_own_filter_shows_them_and_the_check_warns(reporter_settings):
    """What the filter is for: Django's default filter hides settings by name only."""
    from django.core.checks import run_checks

    use_filter(reporter_settings, "django.views.debug.SafeExceptionReporterFilter")
    assert REPORTED["redis"] in error_page("text/plain")
    [warning] = [m for m in run_checks(include_deployment_checks=False) if m.id == "eventbus.W001"]
    for name in ("REDIS_URL", "CACHE_URL", "CELERY_BROKER_URL", "CACHES", "CELERY_BROKER_TRANSPORT_OPTIONS"):
        assert name in warning.msg
    assert not any(password in warning.msg for password in REPORTED.values())
    use_filter(reporter_settings, REPORTER_FILTER)
    assert "eventbus.W001" not in {m.id for m in run_checks(include_deployment_checks=False)}


def test_the_check_leaves_an_empty_secret_key_to_djangos_own_check(reporter_settings):
    """Reading every setting, as the filter does, raises on an empty SECRET_KEY: the check then
    says nothing rather than crashing `manage.py check` (Django's own check names the key)."""
    from eventbus.checks import check_passwords_in_error_reports

    use_filter(reporter_settings, "django.views.debug.SafeExceptionReporterFilter")
    reporter_settings.SECRET_KEY = ""
    assert check_passwords_in_error_reports() == []


def test_the_demo_settings_use_the_filter():
    from config.settings import base

    assert base.DEFAULT_EXCEPTION_REPORTER_FILTER == REPORTER_FILTER


@pytest.mark.parametrize(
    "text, shown",
    [
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("not a url: a@b", "not a url: a@b"),
        ("see https://example.com/a@b for more", "see https://example.com/a@b for more"),
        ("host=h password=x", "host=h password=x"),
        ("h:6379/0?db=1&password=pw", "h:6379/0?db=1&password=***"),
    ],
)
def test_only_a_url_or_a_password_parameter_is_masked(text, shown):
    from eventbus.reporting import masked_secrets

    assert masked_secrets(text) == shown
