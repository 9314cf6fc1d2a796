"""Exactly-once end to end under faults: the short run of tests/e2e/harness.py, on a plain
private Redis and with the event bus on a 3-master Redis Cluster (Celery's broker and the cache
then on a plain private Redis). About a minute each; `make chaos` runs the long one.

CHAOS_SEED=<n> replays a run's random choices (the seed is in its report); the timing of the
processes is not replayable.
"""

import os

import pytest
from django.conf import settings

from .harness import ChaosConfig, run_chaos

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


@pytest.mark.parametrize("cluster", [False, True], ids=["redis", "redis-cluster"])
def test_exactly_once_under_faults(cluster):
    seed = int(os.environ["CHAOS_SEED"]) if os.environ.get("CHAOS_SEED") else None
    result = run_chaos(ChaosConfig.short(cluster=cluster, seed=seed))
    print(result.report)
    # Kept after the run (the last of each kind), for CI logs cut short.
    reports = settings.RUN_DIR / "e2e"
    reports.mkdir(parents=True, exist_ok=True)
    (reports / f"short-{'cluster' if cluster else 'redis'}.txt").write_text(result.report + "\n")
    assert result.ok, result.report
