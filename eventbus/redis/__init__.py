"""The Redis plumbing of the bus: the clients (clients: one per process, Sentinel and Cluster
aware), Sentinel URLs (sentinel), where shards live on a Cluster (placement), the durability check
at start (durability), passwords kept out of messages (redaction) and redis-py's internals behind
the version gate (internals). Inside this package `import redis` is redis-py itself (absolute
imports). See docs/design/code-map.md."""
