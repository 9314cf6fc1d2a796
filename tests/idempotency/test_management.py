"""cleanup_idempotency, the admin, the system checks and the settings accessor."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import Client
from django.test.utils import override_settings
from django.utils import timezone

from idempotency import checks
from idempotency.conf import idempotency_settings
from idempotency.models import IdempotencyRecord
from idempotency.stores.base import Outcome
from idempotency.stores.cached import CachedStore

pytestmark = pytest.mark.django_db


def record(key, expires_in, state="COMPLETED", **fields):
    now = timezone.now()
    return IdempotencyRecord.objects.create(
        scope="-:1",
        key=key,
        fingerprint="fp",
        state=state,
        expires_at=now + timedelta(seconds=expires_in),
        response_status=201,
        response_headers=[["Content-Type", "application/json"]],
        response_body=b'{"job_id": "j-1"}',
        **fields,
    )


def test_cleanup_deletes_exactly_the_expired_and_prints_the_count():
    for i in range(3):
        record(f"old{i}", -1)
    record("fresh", 3600)
    record("running", 3600, state="PENDING")
    out = StringIO()
    call_command("cleanup_idempotency", stdout=out)
    assert "Deleted 3 expired" in out.getvalue()
    assert sorted(IdempotencyRecord.objects.values_list("key", flat=True)) == ["fresh", "running"]
    out = StringIO()
    call_command("cleanup_idempotency", stdout=out)
    assert "Deleted 0 expired" in out.getvalue()


def test_cleanup_at_verbosity_0_prints_nothing():
    record("old", -1)
    out = StringIO()
    call_command("cleanup_idempotency", verbosity=0, stdout=out)
    assert out.getvalue() == ""
    assert not IdempotencyRecord.objects.exists()


def cached_replay(key: str) -> CachedStore:
    """A completed record of `key` whose replay is now in the cache; the store."""
    from idempotency.responses import StoredResponse

    store = CachedStore()
    acquisition = store.acquire(scope="-:1", key=key, fingerprint="fp", lease_seconds=10, ttl_seconds=100)
    store.complete(acquisition.lease, StoredResponse(201, (), b"x"))
    again = store.acquire(scope="-:1", key=key, fingerprint="fp", lease_seconds=10, ttl_seconds=100)
    assert again.outcome is Outcome.REPLAY
    return store


@pytest.mark.redis
@override_settings(IDEMPOTENCY={"STORE": "idempotency.stores.cached.CachedStore"})
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["queryset", "instance", "admin_bulk_delete", "cleanup"])
def test_a_deleted_record_never_replays_from_the_cache(staff_client, how):
    store = cached_replay("del")
    records = IdempotencyRecord.objects.filter(key="del")
    if how == "queryset":
        records.delete()
    elif how == "instance":
        records.get().delete()
    elif how == "admin_bulk_delete":
        response = staff_client.post(
            "/admin/idempotency/idempotencyrecord/",
            {"action": "delete_selected", "_selected_action": [records.get().pk], "post": "yes"},
            follow=True,
        )
        assert response.status_code == 200
    else:
        records.update(expires_at=timezone.now() - timedelta(seconds=1))
        call_command("cleanup_idempotency", verbosity=0)
    assert not IdempotencyRecord.objects.filter(key="del").exists()
    again = store.acquire(scope="-:1", key="del", fingerprint="fp", lease_seconds=10, ttl_seconds=100)
    assert again.outcome is Outcome.ACQUIRED


@pytest.fixture
def staff_client(django_user_model):
    admin = django_user_model.objects.create_user("root", password="x", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin)
    return client


def test_admin_needs_staff(client, user):
    record("k", 3600)
    assert client.get("/admin/idempotency/idempotencyrecord/").status_code == 302  # to the login page
    client.force_login(user)  # logged in, not staff
    assert client.get("/admin/idempotency/idempotencyrecord/").status_code == 302


def test_admin_lists_searches_filters_and_shows_the_stored_response(staff_client):
    r = record("findme", 3600)
    record("other", 3600, state="FAILED")
    listing = staff_client.get("/admin/idempotency/idempotencyrecord/?q=findme&state__exact=COMPLETED")
    assert listing.status_code == 200
    assert b"findme" in listing.content and b"other" not in listing.content
    detail = staff_client.get(f"/admin/idempotency/idempotencyrecord/{r.pk}/change/")
    assert detail.status_code == 200 and b"j-1" in detail.content and b"HTTP 201" in detail.content
    assert staff_client.get("/admin/eventbus/job/?q=x").status_code == 200


@pytest.mark.redis
@override_settings(IDEMPOTENCY={"STORE": "idempotency.stores.cached.CachedStore"})
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("action", ["evict", "expire_now"])
def test_admin_actions_forget_keys_in_database_and_cache(staff_client, action):
    store = cached_replay("gone")
    pk = IdempotencyRecord.objects.get(key="gone").pk
    response = staff_client.post(
        "/admin/idempotency/idempotencyrecord/", {"action": action, "_selected_action": [pk]}, follow=True
    )
    assert response.status_code == 200
    again = store.acquire(scope="-:1", key="gone", fingerprint="fp", lease_seconds=10, ttl_seconds=100)
    assert again.outcome is Outcome.ACQUIRED  # neither the database nor the cache replays it


def test_middleware_order_check(settings):
    assert checks.check_middleware_order() == []
    misordered = list(settings.MIDDLEWARE)
    misordered.remove(checks.MIDDLEWARE_PATH)
    misordered.insert(1, checks.MIDDLEWARE_PATH)
    settings.MIDDLEWARE = misordered
    ids = {e.id for e in checks.check_middleware_order()}
    assert {"idempotency.E001", "idempotency.E002"} <= ids


def test_settings_checks_and_accessor(settings):
    assert checks.check_settings() == []
    settings.IDEMPOTENCY = {"DEFAULT_POLICY": "sometimes", "METHODS": ("GET",), "TTL": -1}
    assert {e.id for e in checks.check_settings()} == {
        "idempotency.E004",
        "idempotency.E005",
        "idempotency.E006",
    }
    settings.IDEMPOTENCY = {"TYPO": 1}
    with pytest.raises(ImproperlyConfigured, match="TYPO"):
        _ = idempotency_settings.TTL
    assert [e.id for e in checks.check_settings()] == ["idempotency.E003"]
    settings.IDEMPOTENCY = {"STORE": "no.such.Store"}
    assert [e.id for e in checks.check_settings()] == ["idempotency.E003"]
    settings.IDEMPOTENCY = {"TTL": 60}
    assert idempotency_settings.TTL == 60 and idempotency_settings.LEASE_SECONDS == 60


def test_a_cache_alias_that_is_not_configured_is_an_error_not_a_silent_fallback(settings):
    from django.core.cache.backends.base import InvalidCacheBackendError

    settings.IDEMPOTENCY = {"STORE": "idempotency.stores.cached.CachedStore", "CACHE_ALIAS": "nope"}
    assert [e.id for e in checks.check_settings()] == ["idempotency.E007"]
    with pytest.raises(InvalidCacheBackendError):
        CachedStore().acquire(scope="-:1", key="k", fingerprint="fp", lease_seconds=10, ttl_seconds=100)
    settings.IDEMPOTENCY = {"STORE": "idempotency.stores.db.DatabaseStore", "CACHE_ALIAS": "nope"}
    assert checks.check_settings() == []  # the database store uses no cache


def test_problem_documentation_check(settings):
    assert checks.check_problem_documentation() == []
    settings.ROOT_URLCONF = "tests.idempotency.urls_without_docs"
    assert [e.id for e in checks.check_problem_documentation()] == ["idempotency.W001"]


def test_metrics_endpoint_counts_outcomes(client):
    body = client.get("/metrics").content.decode()
    assert 'idempotency_requests_total{outcome="replay"}' in body
