"""Secrets stay out of messages and out of other users' reach (SPEC §15): URLs are shown with
their password masked, and the files that hold secrets are created 0600 in 0700 folders."""

import os
import stat

import pytest
from django.core.management import call_command

from config.private_files import private_dir, write_private_file
from eventbus.redaction import masked_url
from eventbus.sentinel import BadSentinelURL, parse_sentinel_url


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
