"""The jobs throttle's counts (gateway.throttling.JSONHistory): an entry that does not decode
lets the request through, as while the cache is down, and nothing read there is unpickled."""

import logging
import pickle

import pytest
from django.core.checks import run_checks
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def throttle_rate(settings, rate):
    rates = {**settings.REST_FRAMEWORK.get("DEFAULT_THROTTLE_RATES", {}), "jobs": rate}
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}


class Forged:
    """What a forged pickle runs when it is unpickled."""

    ran = False

    def __reduce__(self):
        return (_mark_ran, ())


def _mark_ran():
    Forged.ran = True
    return [0.0] * 1000  # a history past any rate, had it been read


def throttle_key(redis_client) -> bytes:
    [key] = redis_client.keys("*throttle_jobs_*")
    return key


@pytest.mark.parametrize(
    "garbage",
    [b"\x80\x04garbage", b"not json", b'{"a": 1}', b'["x"]', b"[NaN]", b"\xff\xfe"],
    ids=["broken-pickle", "text", "object", "strings", "nan", "not-utf8"],
)
def test_a_throttle_entry_that_does_not_decode_lets_the_request_through_logged_then_counts_afresh(
    api_client, settings, redis_client, caplog, garbage
):
    throttle_rate(settings, "5/min")
    assert api_client.get("/api/jobs/").status_code == 200
    key = throttle_key(redis_client)
    redis_client.set(key, garbage)
    with caplog.at_level(logging.WARNING, logger="idempotency.throttling"):
        assert api_client.get("/api/jobs/").status_code == 200
    assert "does not decode" in caplog.text
    for _ in range(4):  # counted afresh from the request that replaced the entry: no way around the rate
        assert api_client.get("/api/jobs/").status_code == 200
    assert api_client.get("/api/jobs/").status_code == 429


def test_a_pickle_written_under_the_throttle_key_is_never_unpickled(settings, redis_client, user, caplog):
    """Even on a django-redis cache with its default serializer (pickle), the throttle reads
    its counts as raw JSON: the forged pickle is an entry that does not decode, never run."""
    caches = {"default": {**settings.CACHES["default"], "OPTIONS": {**settings.CACHES["default"]["OPTIONS"]}}}
    caches["default"]["OPTIONS"].pop("SERIALIZER", None)  # django-redis's default: pickle
    settings.CACHES = caches
    throttle_rate(settings, "5/min")
    client = APIClient()
    client.force_authenticate(user)
    assert client.get("/api/jobs/").status_code == 200
    key = throttle_key(redis_client)
    redis_client.set(key, pickle.dumps(Forged()))
    Forged.ran = False
    assert client.get("/api/jobs/").status_code == 200
    assert not Forged.ran
    for _ in range(4):  # the entry is counted again from the request that replaced it
        assert client.get("/api/jobs/").status_code == 200
    assert client.get("/api/jobs/").status_code == 429


@pytest.mark.parametrize(
    "backend, warned",
    [
        ("django.core.cache.backends.redis.RedisCache", True),
        ("django.core.cache.backends.db.DatabaseCache", True),
        ("django.core.cache.backends.locmem.LocMemCache", False),
        ("django_redis.cache.RedisCache", False),
    ],
)
def test_a_default_cache_that_unpickles_is_warned_of(settings, backend, warned):
    settings.CACHES = {"default": {"BACKEND": backend, "LOCATION": "redis://127.0.0.1:9/0"}}
    ids = {message.id for message in run_checks(include_deployment_checks=False)}
    assert ("gateway.W001" in ids) is warned


def test_an_entry_a_pickling_backend_cannot_decode_lets_the_request_through(api_client, settings, caplog):
    """On another backend the counts go through the cache's API, whose own decoding may fail."""
    from django.core.cache import cache

    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "t"}
    }
    throttle_rate(settings, "2/min")
    assert api_client.get("/api/jobs/").status_code == 200
    [name] = [key for key in cache._cache if "throttle_jobs_" in key]
    cache._cache[name] = b"\x80\x04garbage"  # what LocMemCache unpickles
    with caplog.at_level(logging.WARNING, logger="idempotency.throttling"):
        assert api_client.get("/api/jobs/").status_code == 200
    assert "does not decode" in caplog.text
    assert api_client.get("/api/jobs/").status_code == 200
    assert api_client.get("/api/jobs/").status_code == 429
