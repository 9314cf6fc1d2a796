"""One behaviour suite, run against every store (as django.contrib.sessions tests do)."""

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from idempotency.models import IdempotencyRecord
from idempotency.responses import StoredResponse
from idempotency.stores.base import Outcome
from idempotency.stores.cached import CachedStore
from idempotency.stores.db import DatabaseStore

from .conftest import Clock

pytestmark = pytest.mark.django_db
ANSWER = StoredResponse(201, (("Content-Type", "application/json"),), b'{"ok": true}')


@pytest.fixture(
    params=[DatabaseStore, pytest.param(CachedStore, marks=pytest.mark.redis)], ids=["db", "cached"]
)
def store(request):
    instance = request.param()
    instance.now = Clock()
    return instance


def acquire(store, key="k1", fingerprint="fp1", scope="t:1", lease=10, ttl=100):
    return store.acquire(scope=scope, key=key, fingerprint=fingerprint, lease_seconds=lease, ttl_seconds=ttl)


def test_first_acquire_then_replay(store):
    first = acquire(store)
    assert first.outcome is Outcome.ACQUIRED and first.lease.token
    assert store.complete(first.lease, ANSWER)
    again = acquire(store)
    assert again.outcome is Outcome.REPLAY
    assert again.response == ANSWER


def test_live_lease_is_in_flight_with_retry_after(store):
    acquire(store, lease=10)
    store.now.advance(3)
    second = acquire(store)
    assert second.outcome is Outcome.IN_FLIGHT
    assert second.retry_after == 7


def test_other_fingerprint_is_a_mismatch_in_every_state(store):
    first = acquire(store)
    assert acquire(store, fingerprint="other").outcome is Outcome.MISMATCH  # in flight
    store.complete(first.lease, ANSWER)
    assert acquire(store, fingerprint="other").outcome is Outcome.MISMATCH  # completed (and cached)


def test_scopes_are_independent(store):
    a = acquire(store, scope="t:1")
    b = acquire(store, scope="t:2")
    assert a.outcome is b.outcome is Outcome.ACQUIRED
    store.complete(a.lease, ANSWER)
    assert acquire(store, scope="t:2").outcome is Outcome.IN_FLIGHT


def test_expired_lease_is_taken_over_and_stale_owner_cannot_complete(store):
    dead = acquire(store, lease=5)  # its request died mid-view
    store.now.advance(6)
    retry = acquire(store)
    assert retry.outcome is Outcome.ACQUIRED and retry.takeover
    assert store.complete(retry.lease, ANSWER)
    late = StoredResponse(201, (), b"stale")
    assert not store.complete(dead.lease, late)
    assert not store.fail(dead.lease)
    assert acquire(store).response == ANSWER


def test_takeover_race_has_one_winner(store):
    acquire(store, lease=5)
    store.now.advance(6)
    winner = acquire(store)
    loser = acquire(store)
    assert winner.outcome is Outcome.ACQUIRED
    assert loser.outcome is Outcome.IN_FLIGHT


def test_failed_key_executes_again(store):
    first = acquire(store)
    assert store.fail(first.lease)
    retry = acquire(store)
    assert retry.outcome is Outcome.ACQUIRED and not retry.takeover
    assert not store.complete(first.lease, ANSWER)  # the old token holds nothing any more
    assert store.complete(retry.lease, ANSWER)


def test_expired_record_counts_as_absent(store):
    first = acquire(store, ttl=100)
    store.complete(first.lease, ANSWER)
    store.now.advance(101)
    again = acquire(store, fingerprint="a new request under the old key")
    assert again.outcome is Outcome.ACQUIRED


def test_clear_expired_deletes_exactly_the_expired(store):
    for i in range(3):
        store.complete(acquire(store, key=f"old{i}", ttl=10).lease, ANSWER)
    store.complete(acquire(store, key="young", ttl=1000).lease, ANSWER)
    store.now.advance(11)
    type(store).now = store.now  # clear_expired is a classmethod: it reads the class clock
    try:
        assert type(store).clear_expired() == 3
    finally:
        del type(store).now
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["young"]


def test_evict_forgets_the_key(store):
    store.complete(acquire(store).lease, ANSWER)
    store.evict(scope="t:1", key="k1")
    assert acquire(store).outcome is Outcome.ACQUIRED


def replay_queries(store) -> int:
    """Replay the test's key; how many queries that made."""
    with CaptureQueriesContext(connection) as queries:
        replay = acquire(store)
    assert replay.outcome is Outcome.REPLAY and replay.response == ANSWER
    return len(queries)


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_completed_answer_enters_the_cache_with_its_first_replay():
    """A first request writes nothing to the cache (docs/reference/idempotency.md: its one Redis command is the
    replay check); its first replay reads the record and puts it there for the next ones."""
    store = CachedStore()
    store.complete(acquire(store).lease, ANSWER)
    assert cached_answer(store) is None
    assert replay_queries(store) > 0
    assert replay_queries(store) == 0


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_an_answer_enters_the_cache_only_from_a_committed_record():
    store = CachedStore()
    lease = acquire(store).lease
    with pytest.raises(RuntimeError), transaction.atomic():
        assert store.complete(lease, ANSWER)
        raise RuntimeError("rolled back")
    assert cached_answer(store) is None
    with transaction.atomic():
        assert store.complete(lease, ANSWER)
    assert cached_answer(store) is None
    assert replay_queries(store) > 0  # the committed record answers, and fills the cache
    assert cached_answer(store) == ANSWER


def cached_answer(store):
    known = store.cached(scope="t:1", key="k1", fingerprint="fp1")
    return known and known.response


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_replay_the_database_answered_fills_the_cache_again():
    store = CachedStore()
    store.complete(acquire(store).lease, ANSWER)
    store.forget(scope="t:1", key="k1")  # a flushed or evicted cache
    assert replay_queries(store) > 0  # answered by the database
    assert replay_queries(store) == 0


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_cache_entry_never_outlives_its_record():
    store = CachedStore()
    store.now = Clock()
    store.complete(acquire(store, ttl=100).lease, ANSWER)
    store.now.advance(101)
    assert acquire(store, fingerprint="new").outcome is Outcome.ACQUIRED


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_cache_down_falls_back_to_database(settings):
    store = CachedStore()
    first = acquire(store)
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.2},
        }
    }
    assert store.complete(first.lease, ANSWER)
    assert acquire(store).outcome is Outcome.REPLAY
