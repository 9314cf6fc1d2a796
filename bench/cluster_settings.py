"""Settings of the cluster benchmark's processes (bench/cluster.py starts them): the project's
base settings with DEBUG off and the event bus on a Redis Cluster, with the bench's shard count.

The project's settings have no environment hook for EVENTBUS["DOMAINS"], hence this module.

Environment (set by bench/cluster.py): REDIS_URL (a node of the cluster), CELERY_BROKER_URL and
CACHE_URL (a plain Redis: neither can use a cluster), DATABASE_URL (the bench's own database),
BENCH_CLUSTER_SHARDS (shards of each of the domains scan and chat), BENCH_STREAM_MAXLEN.
"""

import os

from config.settings.base import *  # noqa: F401,F403
from config.settings.base import EVENTBUS

DEBUG = False
SECRET_KEY = "bench-cluster-only-not-a-secret"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

_shards = int(os.environ.get("BENCH_CLUSTER_SHARDS", 6))
EVENTBUS = {
    **EVENTBUS,
    "CLUSTER": True,
    "DOMAINS": {"scan": _shards, "chat": _shards},
    # Long enough for the whole backlog the route phase drains: a trimmed entry would be a gap.
    "STREAM_MAXLEN": int(os.environ.get("BENCH_STREAM_MAXLEN", 10_000)),
}
