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
    try:
        return json.loads(raw) if raw else None
    except (ValueError, RecursionError):  # not the bus's: a key written by someone else
        logger.warning("latest event of %s %s is not JSON; ignored", domain, job_id)
        return None


@dataclass(frozen=True, slots=True)
class Backfill:
    """What a watcher of a job needs to catch up, read in one round trip."""

    entries: list[tuple[bytes, dict]]  # history events with seq > after, in seq order: (raw, parsed)
    applied: int | None  # the router's last applied seq; None: it has none (any more)
    latest: dict | None  # the job's newest published event (its state KV), if any


def job_channel(domain: str, job_id: str) -> str:
    """The pub/sub channel the router publishes the job's events on."""
    return JobKeys(domain, job_id).channel


async def read_backfills(client, asks: list[tuple[str, str, int]]) -> list[Backfill | ValueError]:
    """Each job's history after seq `after`, its applied seq and its latest event, for many
    jobs, (domain, job_id, after) each, in one pipelined round trip (on a cluster, one per
    master; async client): after a Redis blip a gateway resyncs every job it streams.
    A job whose keys hold what is not JSON gets its ValueError, the others their Backfill."""
    async with client.pipeline(transaction=False) as pipe:
        for domain, job_id, after in asks:
            keys = JobKeys(domain, job_id)
            pipe.zrangebyscore(keys.history, f"({after}", "+inf")
            # One command for both: they share the job's hash tag (one slot on a cluster), and
            # each command costs the client and Redis more than its keys do. (redis-py refuses
            # pipe.mget on a cluster pipeline, whatever the keys' slots.)
            pipe.execute_command("MGET", keys.applied, keys.state)
        replies = await pipe.execute()
    return [
        _backfill(raws, *applied_and_state) for raws, applied_and_state in zip(replies[0::2], replies[1::2])
    ]


def _backfill(raws, applied, state) -> Backfill | ValueError:
    try:
        return Backfill(
            [(raw, json.loads(raw)) for raw in raws],
            None if applied is None else int(applied),
            json.loads(state) if state is not None else None,
        )
    except ValueError as exc:
        return exc
    except RecursionError:
        return ValueError("the job's history holds JSON nested too deep to read")
