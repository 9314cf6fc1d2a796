"""The database store: the source of truth. UNIQUE (scope, key) decides races.

Two ways to hold a key while its request runs:
- a durable lease: a PENDING record committed before the work, completed by an UPDATE after
  it (`acquire`, `complete`, `fail`, `release`); any database, any view;
- on PostgreSQL, for work that runs in a transaction on the record's database: a lock of that
  transaction (`claim`), and one INSERT of the answer in it (`record_answer`). Nothing is
  written before the work, and a crash or rollback leaves nothing to take over.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import uuid
from datetime import timedelta

from django.db import IntegrityError, connections, router, transaction

from ..adapters.django import ends_transaction, in_transaction
from ..adapters.psycopg import literals
from ..models import IdempotencyRecord
from ..responses import StoredResponse
from .base import Acquisition, BaseStore, Claim, Found, Lease, Outcome

State = IdempotencyRecord.State
# A record can change under us between the failed INSERT and the read; a few rounds settle it.
MAX_ROUNDS = 5
CLEANUP_BATCH = 1000
# The UNIQUE (scope, key) constraint: the final arbiter between two requests with one key.
KEY_CONSTRAINT = next(c.name for c in IdempotencyRecord._meta.constraints)
# What claim() reads of a record, in this order (Found's fields).
FOUND_FIELDS = (
    "id",
    "fingerprint",
    "state",
    "lease_token",
    "lease_expires_at",
    "expires_at",
    "response_status",
    "response_headers",
    "response_body",
)
ANSWER_FIELDS = (
    "scope",
    "key",
    "fingerprint",
    "method",
    "path",
    "state",
    "lease_token",
    "response_status",
    "response_headers",
    "response_body",
    "created_at",
    "completed_at",
    "expires_at",
)


def lock_id(scope: str, key: str) -> int:
    """The key's PostgreSQL advisory lock: a stable signed 64-bit hash of (scope, key). Two keys
    sharing one (a 2**-64 chance) only make one of them wait (409) while the other runs."""
    digest = hashlib.blake2b(f"{scope}\0{key}".encode(), digest_size=8, person=b"idem-key").digest()
    return int.from_bytes(digest, "big", signed=True)


def _columns(names) -> list[str]:
    column = {field.name: str(field.column) for field in IdempotencyRecord._meta.concrete_fields}
    return [column[name] for name in names]


@functools.cache
def _sql() -> tuple[str, str]:
    """claim()'s reads (a template for quoted literals) and record_answer()'s INSERT, built once."""
    quote = connections[router.db_for_write(IdempotencyRecord)].ops.quote_name
    table = quote(IdempotencyRecord._meta.db_table)
    found = ", ".join(f"r.{quote(c)}" for c in _columns(FOUND_FIELDS))
    scope, key, state, expires = (quote(c) for c in _columns(("scope", "key", "state", "expires_at")))
    # The lock is skipped for a live COMPLETED record, so that concurrent replays never wait.
    lock_and_read = (
        f"SELECT CASE WHEN r.{state} = %s AND r.{expires} > %s THEN NULL ELSE pg_try_advisory_xact_lock(%s) END, "
        f"{found} FROM (SELECT 1) AS one LEFT JOIN {table} AS r ON r.{scope} = %s AND r.{key} = %s"
    )
    read = f"SELECT {found} FROM {table} AS r WHERE r.{scope} = %s AND r.{key} = %s"
    # Two statements, one round trip: the second's snapshot follows the first's lock (claim()).
    claim = f"{lock_and_read}; {read}"
    columns = _columns(ANSWER_FIELDS)
    values = ", ".join("%s::jsonb" if name == "response_headers" else "%s" for name in ANSWER_FIELDS)
    # A template for quoted literals too: record_answer() may append the COMMIT to it.
    insert = f"INSERT INTO {table} ({', '.join(quote(c) for c in columns)}) VALUES ({values})"
    return claim, insert


def _violated(error: IntegrityError) -> str | None:
    """The name of the constraint a PostgreSQL IntegrityError reports."""
    return getattr(getattr(error.__cause__, "diag", None), "constraint_name", None)


def _found(row) -> Found | None:
    if row is None or row[0] is None:
        return None
    pk, fingerprint, state, token, lease_expires_at, expires_at, status, headers, body = row
    # Django has psycopg hand jsonb over as text (its JSONField decodes it).
    headers = json.loads(headers) if isinstance(headers, str) else headers
    return Found(pk, fingerprint, state, token, lease_expires_at, expires_at, status, headers, body)


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
            answer = self._answer(record, fingerprint, now)
            if answer is not None:
                return answer
            if self._take_over(record, lease):
                return Acquisition(
                    Outcome.ACQUIRED,
                    lease=Lease(scope, key, token, fingerprint, record.expires_at),
                    takeover=record.state == State.PENDING,
                )
        return Acquisition(Outcome.IN_FLIGHT, retry_after=1)

    def _answer(self, record, fingerprint, now) -> Acquisition | None:
        """What a live (unexpired) record answers a request under its key; None when the request
        may take the key over: FAILED (nothing stored: execute again), or PENDING whose owner died."""
        if record.fingerprint != fingerprint:
            return Acquisition(Outcome.MISMATCH)
        if record.state == State.COMPLETED:
            return Acquisition(Outcome.REPLAY, response=self._stored(record), expires_at=record.expires_at)
        if record.state == State.PENDING and record.lease_expires_at > now:
            wait = math.ceil((record.lease_expires_at - now).total_seconds())
            return Acquisition(Outcome.IN_FLIGHT, retry_after=max(1, wait))
        return None

    def lock_alias(self, aliases: list[str]) -> str | None:
        """The database on which claim() can hold a key for work in a transaction on `aliases`:
        the record's, when the work's transaction is on it and it is PostgreSQL."""
        using = router.db_for_write(IdempotencyRecord)
        return using if using in aliases and connections[using].vendor == "postgresql" else None

    def claim(self, *, scope, key, fingerprint, ttl_seconds, method="", path="", using) -> Acquisition:
        """Inside the work's transaction on `using` (see lock_alias): hold the key by an advisory
        lock that ends with the transaction, and read its record. ACQUIRED carries a Claim.

        One round trip, two statements. The first takes the lock and reads the record; a record
        it reads that answers (replay, mismatch, another's live lease) is the answer. When it took
        the lock, the second read is the one that counts: its snapshot follows the lock, so it
        sees the answer of a request that held the lock and committed while the first statement
        ran (whose snapshot came before its lock), and the work never runs twice. Two statements
        in one message take the simple query protocol, without parameters: psycopg quotes the
        values (idempotency.adapters.psycopg.literals)."""
        now = self.now()
        connection = connections[using]
        with connection.cursor() as cursor:
            values = (State.COMPLETED, now, lock_id(scope, key), scope, key, scope, key)
            cursor.execute(_sql()[0] % literals(connection, values))
            locked, *row = cursor.fetchone()
            found = _found(row)
            if (
                found is not None
                and found.expires_at > now
                and (answer := self._answer(found, fingerprint, now))
            ):
                return answer
            if not locked:
                return Acquisition(Outcome.IN_FLIGHT, retry_after=1)
            cursor.nextset()
            found = _found(cursor.fetchone())
        takeover, expires_at = False, now + timedelta(seconds=ttl_seconds)
        if found is not None and found.expires_at > now:
            if answer := self._answer(found, fingerprint, now):
                return answer
            takeover, expires_at = found.state == State.PENDING, found.expires_at
        lease = Lease(scope, key, "", fingerprint, expires_at)
        return Acquisition(
            Outcome.ACQUIRED,
            lease=lease,
            takeover=takeover,
            claim=Claim(lease, method, path, now, found, using),
        )

    def record_answer(self, claim: Claim, response: StoredResponse | None, *, last: bool = False) -> bool:
        """In the transaction that claimed the key: store `response` (COMPLETED), or with None
        keep the key FAILED (the work's effects commit without an answer). False when another
        request stored first (the UNIQUE constraint, or the compare-and-set on the record it
        replaces, decides): the caller rolls the work back, and the transaction is aborted.

        `last`: nothing else runs in the transaction after this, on any database. Then, when
        Django is about to commit it (idempotency.adapters.django.ends_transaction: Django's
        internals, always False on its fallback), the INSERT carries the COMMIT in its own
        message, one round trip fewer: psycopg's commit() finds the transaction ended and sends
        nothing. When the INSERT fails, the COMMIT in its message does not run."""
        lease, stored = claim.lease, response is not None
        fields = {
            "scope": lease.scope,
            "key": lease.key,
            "fingerprint": lease.fingerprint,
            "method": claim.method,
            "path": claim.path,
            "state": State.COMPLETED if stored else State.FAILED,
            "lease_token": "",
            "response_status": response.status if response is not None else None,
            "response_headers": [list(pair) for pair in response.headers] if response is not None else [],
            "response_body": response.body if response is not None else None,
            "created_at": claim.now,
            "completed_at": self.now() if stored else None,
            "expires_at": lease.expires_at,
        }
        if claim.replaces is not None:
            return self._take_over(claim.replaces, {**fields, "lease_expires_at": None})
        # Raw SQL: building the ORM's create() costs about as much CPU as the view's own INSERT,
        # on every first request.
        fields["response_headers"] = json.dumps(fields["response_headers"])
        connection = connections[claim.using]
        insert = _sql()[1] % literals(connection, [fields[name] for name in ANSWER_FIELDS])
        if last and ends_transaction(connection):
            insert += "; COMMIT"
        try:
            with connection.cursor() as cursor:
                cursor.execute(insert)
        except IntegrityError as exc:
            if _violated(exc) == KEY_CONSTRAINT:
                return False
            raise
        return True

    def drop(self, claim: Claim) -> None:
        """The work was refused (the key is free again): forget the record it would have replaced."""
        if claim.replaces is not None:
            self._records_as_found(claim.replaces).delete()

    def answer_of_winner(self, *, scope, key, fingerprint) -> Acquisition:
        """After record_answer() lost (and the work rolled back): the answer the winner's record
        gives. A record that gives none (failed, deleted since) is answered 409 for a retry."""
        record = IdempotencyRecord.objects.filter(scope=scope, key=key).first()
        now = self.now()
        answer = self._answer(record, fingerprint, now) if record and record.expires_at > now else None
        return answer or Acquisition(Outcome.IN_FLIGHT, retry_after=1)

    @staticmethod
    def _records_as_found(found):
        return IdempotencyRecord.objects.filter(
            pk=found.pk, state=found.state, lease_token=found.lease_token, expires_at=found.expires_at
        )

    @staticmethod
    def _insert(**fields) -> None:
        """INSERT the record; IntegrityError when (scope, key) exists. Inside a transaction, in a
        savepoint so that the transaction stays usable after the conflict; in autocommit the
        INSERT is a transaction by itself, and BEGIN/COMMIT would only add two round trips."""
        using = router.db_for_write(IdempotencyRecord)
        if in_transaction(using):
            with transaction.atomic(using=using):
                IdempotencyRecord.objects.using(using).create(**fields)
        else:
            IdempotencyRecord.objects.using(using).create(**fields)

    @classmethod
    def _take_over(cls, record, changes) -> bool:
        """Compare-and-set on the lease we saw: of two racing takers, one wins."""
        return bool(cls._records_as_found(record).update(**changes))

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
