"""Prometheus metrics of the bus, labelled by domain and shard. The web app serves the default
registry at /metrics; the long-running commands serve it on --metrics-port."""

from prometheus_client import Counter, Gauge, Histogram, start_http_server

LABELS = ("domain", "shard")

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
CONSUMER_LAG = Gauge("eventbus_consumer_lag", "Entries of the shard stream not yet read by the group", LABELS)
RECLAIM_MESSAGES = Counter(
    "event_router_reclaim_messages_total", "Idle pending entries claimed by the reclaimer", LABELS
)
RECLAIM_LATENCY = Histogram(
    "event_router_reclaim_latency_seconds",
    "Time to reclaim one shard stream (all its XAUTOCLAIM pages)",
    LABELS,
)


def serve(port: int | None) -> None:
    """Expose the default registry on this port (commands' --metrics-port); None: do nothing."""
    if port:
        start_http_server(port)
