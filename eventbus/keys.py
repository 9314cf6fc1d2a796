"""Redis key layout. Every key of one job carries the hash tag {<domain>:<shard>}, so all
keys a script touches share one Redis Cluster slot.

Stage seq ranges per job: vision 10-19, rule 20-29, answer 30-39, reward 40-49, done 50-59
(51 is final); seq = range start + sub_seq.
"""
from __future__ import annotations

import hashlib

from .conf import eventbus_settings

STAGE_BASE = {"vision": 10, "rule": 20, "answer": 30, "reward": 40, "done": 50}
FINAL_SEQ = 51


class UnknownDomain(ValueError):
    pass


def seq_for(stage: str, sub_seq: int) -> int:
    if stage not in STAGE_BASE or not 0 <= sub_seq <= 9:
        raise ValueError(f"No seq for stage {stage!r} sub_seq {sub_seq}: stages {list(STAGE_BASE)}, sub_seq 0-9")
    return STAGE_BASE[stage] + sub_seq


def shard_count(domain: str) -> int:
    try:
        return int(eventbus_settings.DOMAINS[domain])
    except (KeyError, TypeError):  # TypeError: not even a possible name (unhashable)
        raise UnknownDomain(f"Unknown domain {domain!r}; configured: {sorted(eventbus_settings.DOMAINS)}") from None


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


def stream_key(domain: str, shard: int) -> str:
    return f"{tag(domain, shard)}:events"


def dead_letter_key(domain: str, shard: int) -> str:
    return f"{tag(domain, shard)}:dead"
