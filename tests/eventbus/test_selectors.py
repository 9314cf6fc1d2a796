"""The bus's reads survive what a foreign writer may leave in a job's keys."""

import asyncio

import pytest
import redis.asyncio

from eventbus.bus.keys import JobKeys
from eventbus.selectors import latest_event, read_backfills


@pytest.mark.parametrize("state", [b"{not json", b"[" * 200_000, b"[1, 2]", b'"text"'])
def test_a_state_that_is_not_a_json_object_is_no_latest_event(redis_client, caplog, state):
    redis_client.set(JobKeys("scan", "job-s").state, state)
    assert latest_event("scan", "job-s") is None
    assert "is not a JSON object" in caplog.text


def test_a_history_entry_nested_too_deep_is_the_jobs_error_not_the_batchs(redis_client, redis_url):
    redis_client.zadd(JobKeys("scan", "job-deep").history, {b"[" * 200_000: 10})
    redis_client.zadd(JobKeys("scan", "job-ok").history, {b'{"seq": 10}': 10})

    async def read():
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            return await read_backfills(client, [("scan", "job-deep", 0), ("scan", "job-ok", 0)])
        finally:
            await client.aclose()

    deep, ok = asyncio.run(read())
    assert isinstance(deep, ValueError)
    assert [parsed for _raw, parsed in ok.entries] == [{"seq": 10}]
