"""Prometheus metrics of the bus, labelled by domain and shard. The long-running commands serve
their own on --metrics-port; /metrics (config.views) serves every process's.

The bus counts in several processes (Celery's pool publishes, routers apply, the reclaimer
reclaims). With PROMETHEUS_MULTIPROC_DIR set before prometheus_client is first imported, as
`make run` sets it for every process, each process writes its values to files there and /metrics
adds them up.
"""

import atexit
import os

from prometheus_client import Counter, Gauge, Histogram, start_http_server

LABELS = ("domain", "shard")
LOOPBACK = "127.0.0.1"

_children: dict = {}


def child(metric, *labels):
    """metric.labels(*labels), kept: prometheus_client finds it under a lock at every call,
    and the publisher and the router count on every round trip."""
    key = (metric, labels)
    try:
        return _children[key]
    except KeyError:
        found = _children[key] = metric.labels(*labels)
        return found


PUBLISHED = Counter("eventbus_published_total", "Events added to a shard stream (L1)", LABELS)
DUPLICATES = Counter(
    "eventbus_duplicates_total",
    "Events dropped as duplicates: L1 by the publisher, L2 by the router",
    (*LABELS, "layer"),
)
APPLIED = Counter("eventbus_applied_total", "Events applied by the router: state, history, publish", LABELS)
DEFERRED = Counter(
    "eventbus_deferred_total", "Entries held back because the job's previous event is not applied yet", LABELS
)
DEAD_LETTERS = Counter("eventbus_dead_letters_total", "Entries moved to the dead-letter stream", LABELS)
# One value per shard whichever router measured it, so across processes: the latest measurement of
# a live process (a stopped router's last reading is dropped, see mark_process_dead).
CONSUMER_LAG = Gauge(
    "eventbus_consumer_lag",
    "Entries of the shard stream not yet read by the group",
    LABELS,
    multiprocess_mode="livemostrecent",
)
RECLAIM_MESSAGES = Counter(
    "event_router_reclaim_messages_total", "Idle pending entries claimed by the reclaimer", LABELS
)
RECLAIM_LATENCY = Histogram(
    "event_router_reclaim_latency_seconds",
    "Time to reclaim one shard stream (all its XAUTOCLAIM pages)",
    LABELS,
)


def serve(port: int | None, addr: str = LOOPBACK):
    """Expose the default registry on this port (commands' --metrics-port) of `addr`, this machine
    only unless --metrics-addr says otherwise (SPEC §15); None: do nothing. The HTTP server, or None.
    In multiprocess mode too it holds this process's own values: the port answers for this process."""
    if not port:
        return None
    server, _thread = start_http_server(port, addr=addr)
    return server


def mark_process_dead(pid: int | None = None) -> None:
    """Drop a stopped process's live gauges from the multiprocess files (its counters stay: they
    were counted). Nothing to do outside multiprocess mode."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid() if pid is None else pid)


# Every process that imports the bus (Django's app registry does) clears its live gauges when it
# exits normally; Celery's pool processes leave with os._exit, config.celery covers those.
atexit.register(mark_process_dead)
