"""The database store: the source of truth. UNIQUE (scope, key) decides races."""

from __future__ import annotations

import math
import uuid
from datetime import timedelta

from django.db import IntegrityError, router, transaction

from ..models import IdempotencyRecord
from ..responses import StoredResponse
from .base import Acquisition, BaseStore, Lease, Outcome

State = IdempotencyRecord.State
# A record can change under us between the failed INSERT and the read; a few rounds settle it.
MAX_ROUNDS = 5
CLEANUP_BATCH = 1000


class DatabaseStore(BaseStore):
    def acquire(self, *, scope, key, fingerprint, lease_seconds, ttl_seconds, method="", path=""):
        token = uuid.uuid4().hex
        for _ in range(MAX_ROUNDS):
            now = self.now()
            expires_at = now + timedelta(seconds=ttl_seconds)
            lease = {
                "state": State.PENDING,
                "lease_token": token,
                "lease_expires_at": now + timedelta(seconds=lease_seconds),
            }
            fresh = {
                "fingerprint": fingerprint,
                "method": method,
                "path": path,
                "created_at": now,
                "expires_at": expires_at,
                "response_status": None,
                "response_headers": [],
                "response_body": None,
                "completed_at": None,
            }
            try:
                self._insert(scope=scope, key=key, **lease, **fresh)
                return Acquisition(Outcome.ACQUIRED, lease=Lease(scope, key, token, fingerprint, expires_at))
            except IntegrityError:
                pass
            record = IdempotencyRecord.objects.filter(scope=scope, key=key).first()
            if record is None:
                continue  # deleted since (cleanup, eviction): insert again
            if record.expires_at <= now:
                # An expired record counts as absent: start it afresh in place.
                if self._take_over(record, {**lease, **fresh}):
                    return Acquisition(
                        Outcome.ACQUIRED, lease=Lease(scope, key, token, fingerprint, expires_at)
                    )
                continue
            if record.fingerprint != fingerprint:
                return Acquisition(Outcome.MISMATCH)
            if record.state == State.COMPLETED:
                return Acquisition(
                    Outcome.REPLAY, response=self._stored(record), expires_at=record.expires_at
                )
            if record.state == State.PENDING and record.lease_expires_at > now:
                wait = math.ceil((record.lease_expires_at - now).total_seconds())
                return Acquisition(Outcome.IN_FLIGHT, retry_after=max(1, wait))
            # FAILED (nothing stored: execute again), or PENDING whose owner died.
            if self._take_over(record, lease):
                return Acquisition(
                    Outcome.ACQUIRED,
                    lease=Lease(scope, key, token, fingerprint, record.expires_at),
                    takeover=record.state == State.PENDING,
                )
        return Acquisition(Outcome.IN_FLIGHT, retry_after=1)

    @staticmethod
    def _insert(**fields) -> None:
        """INSERT the record; IntegrityError when (scope, key) exists. Inside a transaction, in a
        savepoint so that the transaction stays usable after the conflict; in autocommit the
        INSERT is a transaction by itself, and BEGIN/COMMIT would only add two round trips."""
        using = router.db_for_write(IdempotencyRecord)
        if transaction.get_connection(using).in_atomic_block:
            with transaction.atomic(using=using):
                IdempotencyRecord.objects.using(using).create(**fields)
        else:
            IdempotencyRecord.objects.using(using).create(**fields)

    @staticmethod
    def _take_over(record, changes) -> bool:
        """Compare-and-set on the lease we saw: of two racing takers, one wins."""
        return bool(
            IdempotencyRecord.objects.filter(
                pk=record.pk, state=record.state, lease_token=record.lease_token, expires_at=record.expires_at
            ).update(**changes)
        )

    @staticmethod
    def _stored(record) -> StoredResponse:
        headers = tuple((name, value) for name, value in record.response_headers)
        return StoredResponse(record.response_status, headers, bytes(record.response_body or b""))

    @staticmethod
    def _held(lease: Lease):
        return IdempotencyRecord.objects.filter(
            scope=lease.scope, key=lease.key, lease_token=lease.token, state=State.PENDING
        )

    def complete(self, lease, response):
        return bool(
            self._held(lease).update(
                state=State.COMPLETED,
                response_status=response.status,
                response_headers=[list(pair) for pair in response.headers],
                response_body=response.body,
                completed_at=self.now(),
                lease_expires_at=None,
            )
        )

    def fail(self, lease):
        return bool(self._held(lease).update(state=State.FAILED, lease_expires_at=None))

    def release(self, lease):
        deleted, _ = self._held(lease).delete()
        return bool(deleted)

    def renew(self, lease, lease_seconds):
        return bool(self._held(lease).update(lease_expires_at=self.now() + timedelta(seconds=lease_seconds)))

    def evict(self, *, scope, key):
        IdempotencyRecord.objects.filter(scope=scope, key=key).delete()

    @classmethod
    def clear_expired(cls):
        # In batches: deleting sends post_delete per record (signals.py), which loads the rows.
        now, deleted = cls.now(), 0
        expired = IdempotencyRecord.objects.filter(expires_at__lte=now)
        while batch := list(expired.values_list("pk", flat=True)[:CLEANUP_BATCH]):
            count, _ = IdempotencyRecord.objects.filter(pk__in=batch).only("pk", "scope", "key").delete()
            deleted += count
        return deleted
