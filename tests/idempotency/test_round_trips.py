"""What the idempotency layer adds to a first request of an atomic view on PostgreSQL, counted
(the README's Measured table): at most two round trips, the key's lock-and-read and the replay check, with the
answer's INSERT riding on the view's COMMIT. Counted, never timed: PostgreSQL round trips by
the protocol (libpq's trace: one ReadyForQuery ends each), Redis commands by the server's
INFO commandstats, for the jobs API's create with the layer and the same view without it."""

import re
import tempfile
from dataclasses import dataclass

import pytest
from django.db import connection
from django.test import Client

from idempotency.adapters import django as django_adapter

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.idempotency.urls"),
    pytest.mark.postgres,  # the atomic view's lock is PostgreSQL's
]

JOB = '{"domain": "scan", "payload": {}}'


@dataclass
class Cost:
    status: int
    postgres: list[str]  # what the client sent, one entry per round trip
    redis: dict[str, int]  # commands by name

    @property
    def redis_calls(self) -> int:
        return sum(self.redis.values())


def redis_calls(client) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): row["calls"] for name, row in stats.items()}


def sent_per_round_trip(trace: str) -> list[str]:
    """The frontend's statements, grouped by the ReadyForQuery that ended each exchange."""
    trips, current = [], []
    for line in trace.splitlines():
        parts = line.split("\t")
        if len(parts) < 3:
            continue
        if parts[0] == "F" and parts[2] in ("Query", "Parse"):
            current.append(re.sub(r"\s+", " ", parts[3].strip()) if len(parts) > 3 else parts[2])
        elif parts[0] == "B" and parts[2] == "ReadyForQuery":
            trips.append(" | ".join(current))
            current = []
    return trips


def cost(client: Client, path: str, key: str, redis_client) -> Cost:
    from psycopg.pq import Trace

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    before = redis_calls(redis_client)
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
        try:
            response = client.post(path, data=JOB, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)
        finally:
            pgconn.untrace()
        trace.seek(0)
        trips = sent_per_round_trip(trace.read())
    after = redis_calls(redis_client)
    redis = {name: after[name] - before.get(name, 0) for name in after if after[name] != before.get(name, 0)}
    redis["info"] = redis.get("info", 0) - 1  # the count's own INFO
    return Cost(response.status_code, trips, {name: n for name, n in redis.items() if n})


def test_a_first_request_of_an_atomic_view_costs_two_round_trips_more(user, redis_client):
    client = Client()
    client.force_login(user)
    # Warm: connections open, statements known, the token and session read as they are then.
    for path in ("/t/jobs-without-the-layer/", "/api/jobs/"):
        assert cost(client, path, f"warm-{path}", redis_client).status == 201
    without = cost(client, "/t/jobs-without-the-layer/", "first-without", redis_client)
    with_layer = cost(client, "/api/jobs/", "first-with", redis_client)
    assert without.status == with_layer.status == 201
    added_postgres = len(with_layer.postgres) - len(without.postgres)
    added_redis = with_layer.redis_calls - without.redis_calls
    detail = f"with the layer {shown(with_layer)}, without {shown(without)}"
    # The key's lock-and-read on PostgreSQL, the replay check (a GET) on Redis: nothing else.
    # (On its public-API fallback the adapter leaves the COMMIT to Django: one round trip more.)
    assert added_postgres == (1 if django_adapter.INTERNALS else 2), detail
    assert {k: with_layer.redis.get(k, 0) - without.redis.get(k, 0) for k in with_layer.redis} == {
        **{k: 0 for k in with_layer.redis},
        "get": 1,
    }, detail
    if not django_adapter.INTERNALS:
        return
    assert added_postgres + added_redis <= 2, detail
    # The answer's INSERT carries the COMMIT: no round trip of its own.
    assert '"COMMIT"' in without.postgres and '"COMMIT"' not in with_layer.postgres, detail
    [answer] = [
        t for t in with_layer.postgres if t.startswith('"INSERT INTO "idempotency_idempotencyrecord"')
    ]
    assert answer.endswith('COMMIT"'), detail


def shown(cost: Cost) -> str:
    """The round trips, each statement cut short, and the Redis commands."""
    trips = [
        "; ".join(part[:50] + ("..." if len(part) > 50 else "") for part in trip.split("; "))
        for trip in cost.postgres
    ]
    return f"{cost.status}: PostgreSQL {trips}, Redis {cost.redis}"
