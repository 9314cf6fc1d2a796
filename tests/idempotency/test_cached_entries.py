"""What the cached store reads back from Redis is data, never code: a forged,
corrupt, unsigned or misplaced entry is a miss, logged, and the database answers.

These tests write into the real Redis, under the very key the store reads, what someone with
write access to Redis could write there."""

import base64
import json
import logging
import os
import pickle
import shlex

import pytest
from django.core.cache import caches
from django.test import Client

from idempotency import checks
from idempotency.models import IdempotencyRecord
from idempotency.stores.cached import CachedStore

from . import views

pytestmark = [
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.idempotency.urls"),
]
CACHED = {"STORE": "idempotency.stores.cached.CachedStore"}
LOGGER = "idempotency.stores.cached"


@pytest.fixture(autouse=True)
def cached_store(settings):
    settings.IDEMPOTENCY = CACHED


def redis_key(scope: str, key: str) -> str:
    """The Redis key the store reads the cached answer of (scope, key) from."""
    return caches["default"].make_key(CachedStore().cache_key(scope, key))


def send(client, key, body=b'{"amount": 10}'):
    return client.post("/t/plain/", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


def scope_of(user) -> str:
    return f"-:{user.pk}"


class RunsAShellCommand:
    """A pickle that, once unpickled, runs `touch <path>` through os.system."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.path))}",))


def assert_answered_by_the_database(response, first, caplog):
    assert response.status_code == 201
    assert response["Idempotent-Replayed"] == "true"
    assert response.content == first.content
    assert views.CALLS["plain"] == 1
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert warnings, "an entry the store refused must be logged"
    return warnings


def test_a_pickle_written_under_the_key_never_runs(client_for, user, redis_client, tmp_path, caplog):
    client = client_for(user)
    first = send(client, "pwn-1")
    assert first.status_code == 201
    marker = tmp_path / "pwned"
    payload = pickle.dumps(RunsAShellCommand(marker))
    assert redis_client.set(redis_key(scope_of(user), "pwn-1"), payload)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        again = send(client, "pwn-1")

    assert not marker.exists(), "the cached entry was unpickled: it ran a shell command"
    warnings = assert_answered_by_the_database(again, first, caplog)
    logged = " ".join(r.getMessage() + str(r.exc_info or "") for r in warnings)
    assert "touch" not in logged and "posix" not in logged and "system" not in logged


def test_a_tampered_entry_is_ignored(client_for, user, redis_client, caplog):
    """The real entry, valid JSON, its status and body changed, its signature kept: a miss."""
    client = client_for(user)
    first = send(client, "tamper-1")
    send(client, "tamper-1")  # its first replay puts it in the cache
    name = redis_key(scope_of(user), "tamper-1")
    entry = redis_client.get(name)
    assert entry is not None, "the first replay cached the answer"
    signature, _, data = entry.partition(b".")
    forged = json.loads(data)
    forged.update(status=200, body=base64.b64encode(b'{"forged": true}').decode())
    redis_client.set(name, signature + b"." + json.dumps(forged).encode())

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        again = send(client, "tamper-1")

    assert_answered_by_the_database(again, first, caplog)


@pytest.mark.parametrize(
    "garbage", [b"", b"x", b"123", b"{}", b'{"status": 200, "body": "forged"}', b"\x00" * 64, b"\xff" * 200]
)
def test_unsigned_or_corrupt_entries_are_misses(client_for, user, redis_client, caplog, garbage):
    client = client_for(user)
    first = send(client, "junk-1")
    redis_client.set(redis_key(scope_of(user), "junk-1"), garbage)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        again = send(client, "junk-1")
    assert_answered_by_the_database(again, first, caplog)


def test_another_keys_signed_entry_is_not_replayed(client_for, user, other_user, redis_client, caplog):
    """An entry is signed for its own (scope, key): copied under another user's key, it is a
    miss (one user's answer never reaches another), though its signature is genuine."""
    alice, bob = client_for(user), client_for(other_user)
    first_alice, first_bob = send(alice, "same"), send(bob, "same")
    assert first_alice.content != first_bob.content
    send(alice, "same")  # its first replay puts alice's answer in the cache
    alice_entry = redis_client.get(redis_key(scope_of(user), "same"))
    assert alice_entry is not None
    redis_client.set(redis_key(scope_of(other_user), "same"), alice_entry)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        again = send(bob, "same")

    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == first_bob.content
    assert views.CALLS["plain"] == 2


def test_an_entry_is_data_a_redis_client_can_read(client_for, user, redis_client):
    """No pickle: the entry is a signature and JSON."""
    send(client_for(user), "plain-data")
    send(client_for(user), "plain-data")  # its first replay puts it in the cache
    entry = redis_client.get(redis_key(scope_of(user), "plain-data"))
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(entry)  # noqa: S301 (proving it is not a pickle)


def test_the_cache_still_serves_replays():
    """The signed entry round-trips: a replay needs no database query."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_X_PRINCIPAL="svc-1")
    with override_resolver():
        first = send(client, "fast")
        send(client, "fast")  # its first replay puts it in the cache
        with CaptureQueriesContext(connection) as queries:
            again = send(client, "fast")
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert len(queries) == 0
    assert IdempotencyRecord.objects.count() == 1


def override_resolver():
    from django.test.utils import override_settings

    return override_settings(
        IDEMPOTENCY={**CACHED, "SCOPE_RESOLVER": "tests.idempotency.resolvers.HeaderScopeResolver"}
    )


@pytest.mark.parametrize(
    "backend",
    [
        "django.core.cache.backends.locmem.LocMemCache",
        "django.core.cache.backends.redis.RedisCache",
        "django.core.cache.backends.db.DatabaseCache",
    ],
)
def test_a_cache_that_is_not_django_redis_is_a_check_error_and_a_run_time_error(settings, backend):
    from django.core.exceptions import ImproperlyConfigured

    settings.CACHES = {**settings.CACHES, "other": {"BACKEND": backend, "LOCATION": "redis://127.0.0.1:1/0"}}
    settings.IDEMPOTENCY = {**CACHED, "CACHE_ALIAS": "other"}
    errors = checks.check_settings()
    assert [e.id for e in errors] == ["idempotency.E008"]
    assert "django_redis.cache.RedisCache" in errors[0].msg and backend in errors[0].msg
    with pytest.raises(ImproperlyConfigured, match="django_redis"):
        CachedStore().acquire(scope="-:1", key="k", fingerprint="fp", lease_seconds=10, ttl_seconds=100)
    settings.IDEMPOTENCY = {"STORE": "idempotency.stores.db.DatabaseStore", "CACHE_ALIAS": "other"}
    assert checks.check_settings() == []


def test_a_cached_replay_is_one_redis_get(redis_client):
    """The replay path: one GET (and one HMAC), no other Redis command."""
    client = Client(HTTP_X_PRINCIPAL="svc-1")
    with override_resolver():
        send(client, "one-get")
        send(client, "one-get")  # its first replay puts it in the cache
        redis_client.config_resetstat()
        again = send(client, "one-get")
        stats = redis_client.info("commandstats")
    assert again["Idempotent-Replayed"] == "true"
    calls = {name.removeprefix("cmdstat_"): s["calls"] for name, s in stats.items()}
    calls.pop("info", None), calls.pop("config|resetstat", None)
    assert calls == {"get": 1}


def test_entries_signed_with_a_rotated_secret_key(settings, caplog):
    """After a SECRET_KEY rotation, entries signed with a key in SECRET_KEY_FALLBACKS still
    serve replays; with the old key dropped they are misses and the database answers."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_X_PRINCIPAL="svc-1")
    with override_resolver():
        first = send(client, "rotated")
        send(client, "rotated")  # its first replay puts it in the cache
        old = settings.SECRET_KEY
        settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "a-new-secret-key", [old]
        with CaptureQueriesContext(connection) as queries:
            again = send(client, "rotated")
        assert again.content == first.content and len(queries) == 0
        settings.SECRET_KEY_FALLBACKS = []
        with caplog.at_level(logging.WARNING, logger=LOGGER), CaptureQueriesContext(connection) as queries:
            dropped = send(client, "rotated")
    assert dropped["Idempotent-Replayed"] == "true" and dropped.content == first.content
    assert len(queries) > 0
    assert any(r.name == LOGGER for r in caplog.records)
