"""Reads of the bus's per-job data (HackSoft-style selectors: no writes here)."""
from __future__ import annotations

import json
import logging

from redis.exceptions import RedisError

from .keys import JobKeys, UnknownDomain
from .redis import get_redis

logger = logging.getLogger(__name__)


def latest_event(domain: str, job_id: str) -> dict | None:
    """The job's latest published event (its state KV), or None when there is none (yet,
    or any more: the state expires after EVENTBUS['STATE_TTL']) or Redis cannot answer."""
    try:
        raw = get_redis().get(JobKeys(domain, job_id).state)
    except (RedisError, UnknownDomain):
        logger.warning("latest event of %s %s unavailable", domain, job_id, exc_info=True)
        return None
    return json.loads(raw) if raw else None
