"""gateway.gcpause: the cyclic GC's full collections held off while a resync's reads are out,
and GRACE_SECONDS after; the young collections never."""

import asyncio
import gc

import pytest

from gateway import gcpause


@pytest.fixture(autouse=True)
def thresholds(monkeypatch):
    before = gc.get_threshold()
    monkeypatch.setattr(gcpause, "GRACE_SECONDS", 0.05)
    monkeypatch.setattr(gcpause, "LIMIT_SECONDS", 0.3)
    yield before
    gc.set_threshold(*before)


def held() -> bool:
    return gc.get_threshold()[2] == gcpause.HELD


async def test_full_collections_wait_for_the_reads_and_the_grace_after(thresholds):
    loop = asyncio.get_running_loop()
    reads = [loop.create_future(), loop.create_future()]
    gcpause.full_collections_held_until(reads)
    assert held() and gc.get_threshold()[:2] == thresholds[:2]  # the young ones go on
    reads[0].set_result(None)
    await asyncio.sleep(0.1)
    assert held()  # one read still out
    reads[1].set_result(None)
    await asyncio.sleep(0.01)
    assert held()  # the grace: the frames the reads bring are still being sent
    await asyncio.sleep(0.1)
    assert gc.get_threshold() == thresholds


async def test_holds_nest_and_the_last_one_restores(thresholds):
    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()
    gcpause.full_collections_held_until([first])
    gcpause.full_collections_held_until([second])
    first.set_result(None)
    await asyncio.sleep(0.1)
    assert held()
    second.set_result(None)
    await asyncio.sleep(0.1)
    assert gc.get_threshold() == thresholds


async def test_a_read_that_never_answers_holds_them_off_no_longer_than_the_limit(thresholds):
    gcpause.full_collections_held_until([asyncio.get_running_loop().create_future()])
    assert held()
    await asyncio.sleep(0.4)
    assert gc.get_threshold() == thresholds


async def test_thresholds_set_by_someone_else_meanwhile_stand(thresholds):
    read = asyncio.get_running_loop().create_future()
    gcpause.full_collections_held_until([read])
    gc.set_threshold(500, 5, 5)
    read.set_result(None)
    await asyncio.sleep(0.1)
    assert gc.get_threshold() == (500, 5, 5)


def test_no_reads_no_hold(thresholds):
    gcpause.full_collections_held_until([])
    assert gc.get_threshold() == thresholds
