"""Without the OpenTelemetry API (the `otel` extra not installed), a process imports nothing of
it and starts, runs and routes jobs all the same: a subprocess that cannot import it
(tests/test_tracing.py traces with it). A module of its own: its tier (`processes`) is not the
traced tests' (`redis`)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from eventbus.bus.keys import JobKeys
from eventbus.models import Job
from tests.processes import BASE_DIR, process_env

SCAN_SEQS = [10, 20, 30, 40, 51]


@pytest.fixture
def broker(redis_client, redis_url):
    """This process's Celery app sends to the test Redis (a run enqueued on commit goes there)."""
    from tests.eventbus.helpers import point_broker

    point_broker(redis_url)
    return redis_client


NO_OTEL = textwrap.dedent(
    """
    import json, sys
    sys.modules["opentelemetry"] = None  # as if the `otel` extra were not installed
    import django
    django.setup()
    from django.contrib.auth import get_user_model
    from eventbus.bus.router import Router
    from eventbus.job import runs
    from eventbus.services import start_job
    from exactly_once import tracing
    import gateway.hub, idempotency.middleware  # every module that traces
    from tests.eventbus.helpers import history

    owner = get_user_model().objects.get(username=sys.argv[1])
    job, created = start_job("scan", {}, key="untraced", owner=owner)
    outcome = runs.run(str(job.pk))
    Router(burst=True, consumer="untraced").run()
    from eventbus.redis.clients import get_redis
    print(json.dumps({
        "tracing": tracing.TRACING,
        "trace_context": job.trace_context,
        "outcome": outcome,
        "seqs": [e["seq"] for e in history(get_redis(), "scan", str(job.pk))],
        "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m] is not None),
    }))
    """
)


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_without_the_api_nothing_is_imported_and_jobs_run(user, broker):
    done = subprocess.run(
        [sys.executable, "-c", NO_OTEL, user.username],
        cwd=BASE_DIR,
        env=process_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {
        "tracing": False,
        "trace_context": "",
        "outcome": "COMPLETED",
        "seqs": SCAN_SEQS,
        "otel": [],
    }
    job = Job.objects.get(idem_key="untraced")
    entries = broker.xrange(JobKeys("scan", str(job.pk)).stream)
    assert entries and all(b"tp" not in fields for _, fields in entries)
