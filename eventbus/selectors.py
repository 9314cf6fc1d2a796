"""Reads of the bus's per-job data (HackSoft-style selectors: no writes here)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class Backfill:
    """What a watcher of a job needs to catch up, read in one round trip."""

    entries: list[tuple[bytes, dict]]  # history events with seq > after, in seq order: (raw, parsed)
    applied: int | None  # the router's last applied seq; None: it has none (any more)
    latest: dict | None  # the job's newest published event (its state KV), if any


def job_channel(domain: str, job_id: str) -> str:
    """The pub/sub channel the router publishes the job's events on."""
    return JobKeys(domain, job_id).channel


async def read_backfill(client, domain: str, job_id: str, *, after: int) -> Backfill:
    """The job's history after seq `after`, its applied seq and its latest event (async client)."""
    keys = JobKeys(domain, job_id)
    async with client.pipeline(transaction=False) as pipe:
        pipe.zrangebyscore(keys.history, f"({after}", "+inf")
        pipe.get(keys.applied)
        pipe.get(keys.state)
        raws, applied, state = await pipe.execute()
    return Backfill(
        [(raw, json.loads(raw)) for raw in raws],
        None if applied is None else int(applied),
        json.loads(state) if state is not None else None,
    )
