"""accept_once on a model other than the job: IdempotencyRecord, whose primary key the database
assigns (an AutoField) and whose UNIQUE constraint is (scope, key)."""

import pytest
from django.utils import timezone

from idempotency.exceptions import IdempotencyKeyMismatch
from idempotency.models import IdempotencyRecord
from idempotency.services import accept_once

pytestmark = pytest.mark.django_db


def record(fingerprint="fp"):
    return IdempotencyRecord(scope="t:1", key="k1", fingerprint=fingerprint, expires_at=timezone.now())


def accept(row):
    return accept_once(row, unique=("scope", "key"), same=("fingerprint",))


def test_a_row_whose_key_the_database_assigns_comes_back_with_it_once():
    first, created = accept(record())
    assert created and first.pk is not None
    assert first.pk == IdempotencyRecord.objects.get(key="k1").pk
    again, created = accept(record())
    assert not created and again.pk == first.pk
    assert IdempotencyRecord.objects.count() == 1


def test_the_same_key_for_another_request_is_a_mismatch():
    accept(record())
    with pytest.raises(IdempotencyKeyMismatch):
        accept(record(fingerprint="other"))
