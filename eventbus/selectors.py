"""Reads of the bus's per-job data (HackSoft-style selectors: no writes here)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from .jobtypes import UnknownDomain
from .keys import JobKeys
from .redis import get_redis

if TYPE_CHECKING:
    from .models import StageRecord

logger = logging.getLogger(__name__)


def latest_event(domain: str, job_id: str) -> dict | None:
    """The job's latest published event (its state KV), or None when there is none (yet,
    or any more: the state expires after EVENTBUS['STATE_TTL']) or Redis cannot answer."""
    try:
        raw = get_redis().get(JobKeys(domain, job_id).state)
    except (RedisError, UnknownDomain):
        logger.warning("latest event of %s %s unavailable", domain, job_id, exc_info=True)
        return None
    if not raw:
        return None
    try:
        return json_object(raw)
    except ValueError:
        # Only a writer other than the bus's scripts puts this there: no answer, not a 500.
        logger.warning("latest event of %s %s is not a JSON object; ignored", domain, job_id)
        return None


def json_object(raw: bytes) -> dict:
    """A JSON object read back from Redis; ValueError for anything else (not JSON, nested past
    the parser's recursion limit, or another type), which only a foreign writer leaves there."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deep") from None
    if not isinstance(value, dict):
        raise ValueError(f"a JSON {type(value).__name__}, not an object")
    return value


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
            [(raw, json_object(raw)) for raw in raws],
            None if applied is None else int(applied),
            json_object(state) if state is not None else None,
        )
    except ValueError as exc:
        return exc


@dataclass(frozen=True, slots=True)
class StageRow:
    """One stage of a job as the admin's timeline shows it: a declared stage, or a recorded one
    its type no longer declares (or of a type no longer registered)."""

    name: str
    label: str
    state: str  # StageRecord.state, or PENDING for a declared stage without a record
    record: StageRecord | None


def job_stages(operation, records=None) -> list[StageRow]:
    """Every stage of the job: its type's declared stages in order, each with its record (or
    PENDING), then the records of stages the type does not declare, by when they started."""
    from .jobtypes import UnknownJobType, job_type

    if records is None:
        records = list(operation.stage_records.all())
    by_name = {record.stage: record for record in records}
    try:
        planned = job_type(operation.domain).plan()
    except UnknownJobType:
        planned = []
    rows = []
    for stage in planned:
        record = by_name.pop(stage.name, None)
        rows.append(StageRow(stage.name, stage.label, record.state if record else "PENDING", record))
    for record in sorted(by_name.values(), key=lambda r: r.started_at):
        rows.append(StageRow(record.stage, record.stage, record.state, record))
    return rows
