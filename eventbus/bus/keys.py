"""Redis key layout: every key of the bus is named here, and nowhere else (the design page
"The Redis key layout", docs/design/keys.md, lists them). Every key of one job carries the hash
tag {<domain>:<shard>}, so all keys a script touches share one Redis Cluster slot.

Which domains exist and how many shards each has is the registry's (eventbus.jobtypes:
`domains()`, `shard_count()`, UnknownJobType); this module only names the keys.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

from eventbus.jobtypes import shard_count


# A worker publishes a job's events one after the other, and the router routes them: the same
# job's shard again and again.
@lru_cache(maxsize=16384)
def shard_for(job_id: str, shards: int) -> int:
    return int(hashlib.md5(str(job_id).encode()).hexdigest(), 16) % shards


def tag(domain: str, shard: int) -> str:
    return f"{{{domain}:{shard}}}"


class JobKeys:
    """Every key of one job, all in the slot of its {domain:shard} tag."""

    __slots__ = ("domain", "job_id", "shard", "tag")

    def __init__(self, domain: str, job_id: str):
        self.domain = domain
        self.job_id = str(job_id)
        self.shard = shard_for(self.job_id, shard_count(domain))
        self.tag = tag(domain, self.shard)

    @property
    def stream(self) -> str:
        return stream_key(self.domain, self.shard)

    @property
    def state(self) -> str:
        return f"{self.tag}:state:{self.job_id}"

    @property
    def history(self) -> str:
        return f"{self.tag}:history:{self.job_id}"

    @property
    def channel(self) -> str:
        return f"{self.tag}:channel:{self.job_id}"

    @property
    def last_published(self) -> str:
        """The job's last seq accepted by the publish script (L1): the next event's prev_seq."""
        return f"{self.tag}:published-seq:{self.job_id}"

    @property
    def applied(self) -> str:
        """The job's last seq applied by the router (L2): the next event applies only on top of it."""
        return f"{self.tag}:applied-seq:{self.job_id}"

    def published(self, stage: str, seq: int) -> str:
        return f"{self.tag}:published:{self.job_id}:{stage}:{seq}"

    def router_published(self, seq: int) -> str:
        return f"{self.tag}:router:published:{self.job_id}:{seq}"

    @property
    def run_lease(self) -> str:
        """The job's run lease: one run of the job at a time (eventbus.job.runs.RunLease)."""
        return f"{self.tag}:run-lease:{self.job_id}"

    @property
    def cancel_flag(self) -> str:
        """The flag a cancel sets for the job's running stage (eventbus.job.cancellation)."""
        return f"{self.tag}:cancel:{self.job_id}"


def stream_key(domain: str, shard: int) -> str:
    return f"{tag(domain, shard)}:events"


def dead_letter_key(domain: str, shard: int) -> str:
    return f"{tag(domain, shard)}:dead"
