from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from . import views


@pytest.fixture(autouse=True)
def fresh_calls():
    views.CALLS.clear()
    views.GATES.clear()
    views.KILLS.clear()
    yield


@pytest.fixture
def durable_leases(monkeypatch):
    """Atomic views hold their key by a durable lease, as on databases other than PostgreSQL
    (on PostgreSQL they hold it by a lock of their transaction: DatabaseStore.lock_alias)."""
    from idempotency.stores.db import DatabaseStore

    monkeypatch.setattr(DatabaseStore, "lock_alias", lambda self, aliases: None)


@pytest.fixture
def client_for():
    """A Django test client logged in as the given user (session auth)."""

    def make(user):
        client = Client()
        client.force_login(user)
        return client

    return make


@pytest.fixture
def token_client_for():
    """A DRF client that authenticates with a real token header."""

    def make(user):
        token, _ = Token.objects.get_or_create(user=user)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
        return client

    return make


class Clock:
    """A stopped clock for the stores (their `now`): a test moves it on instead of sleeping."""

    def __init__(self):
        self.t = timezone.now()

    def __call__(self):
        return self.t

    def advance(self, seconds):
        self.t += timedelta(seconds=seconds)


@pytest.fixture
def store_clock(monkeypatch):
    """Every store's clock (BaseStore.now, which leases and expiries are measured by), stopped."""
    from idempotency.stores.base import BaseStore

    clock = Clock()
    monkeypatch.setattr(BaseStore, "now", staticmethod(clock))
    return clock
