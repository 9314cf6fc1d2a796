"""Exactly-once end to end under faults: the short run of tests/e2e/harness.py, on a plain
private Redis, with the event bus on a 3-master Redis Cluster (Celery's broker and the cache
then on a plain private Redis), and on a Sentinel-managed master and replica that fail over
under load. On PostgreSQL every run also kills database sessions mid-request. About a minute
each; `make chaos` runs the long one.

CHAOS_SEED=<n> replays a run's random choices (the seed is in its report); the timing of the
processes is not replayable.
"""

import os

import pytest
from django.conf import settings

from tests.conftest import skip_without_cluster_client

from .harness import ChaosConfig, run_chaos

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


@pytest.mark.parametrize(
    "redis", ["redis", "cluster", "sentinel"], ids=["redis", "redis-cluster", "redis-sentinel"]
)
def test_exactly_once_under_faults(redis):
    if redis == "cluster":
        skip_without_cluster_client()
    seed = int(os.environ["CHAOS_SEED"]) if os.environ.get("CHAOS_SEED") else None
    result = run_chaos(ChaosConfig.short(cluster=redis == "cluster", sentinel=redis == "sentinel", seed=seed))
    print(result.report)
    # Kept after the run (the last of each kind), for CI logs cut short.
    reports = settings.RUN_DIR / "e2e"
    reports.mkdir(parents=True, exist_ok=True)
    (reports / f"short-{redis}.txt").write_text(result.report + "\n")
    assert result.ok, result.report
