"""gateway.eager.start: a coroutine runs in the caller until it finishes or waits, and a task
finishes the rest of one that waits, in order, with its result or its error."""

import asyncio
import gc

import pytest

from gateway import eager


async def steps(log, waits_for=None, fail_at=None):
    log.append("before")
    if fail_at == "before":
        raise ValueError("before")
    if waits_for is not None:
        log.append(await waits_for)
    if fail_at == "after":
        raise ValueError("after")
    log.append("done")
    return "result"


async def test_a_coroutine_that_does_not_wait_runs_to_its_end_in_the_caller():
    log = []
    assert eager.start(steps(log)) is None
    assert log == ["before", "done"]  # already: no turn of the loop in between


async def test_an_error_before_any_wait_is_raised_in_the_caller():
    with pytest.raises(ValueError, match="before"):
        eager.start(steps([], fail_at="before"))


async def test_a_coroutine_that_waits_is_finished_by_a_task_once_what_it_waits_for_is_done():
    log = []
    gate = asyncio.get_running_loop().create_future()
    rest = eager.start(steps(log, waits_for=gate))
    assert rest is not None and log == ["before"]
    await asyncio.sleep(0.01)
    assert not rest.done() and log == ["before"]  # still waiting for the gate
    gate.set_result("opened")
    assert await asyncio.wait_for(rest, 1) == "result"
    assert log == ["before", "opened", "done"]


async def test_an_error_after_the_wait_reaches_the_future_of_the_rest():
    gate = asyncio.get_running_loop().create_future()
    rest = eager.start(steps([], waits_for=gate, fail_at="after"))
    gate.set_result(None)
    with pytest.raises(ValueError, match="after"):
        await asyncio.wait_for(rest, 1)


async def test_an_error_of_what_it_waits_for_is_raised_in_the_coroutine():
    gate = asyncio.get_running_loop().create_future()
    log = []
    rest = eager.start(steps(log, waits_for=gate))
    gate.set_exception(ConnectionResetError("client gone"))
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(rest, 1)
    assert log == ["before"]


async def test_a_bare_yield_goes_on_at_the_next_turn_of_the_loop():
    log = []

    async def yields():
        log.append(1)
        await asyncio.sleep(0)
        log.append(2)

    rest = eager.start(yields())
    assert rest is not None and log == [1]
    await asyncio.wait_for(rest, 1)
    assert log == [1, 2]


async def test_a_waiter_that_leaves_cancels_the_rest_and_no_error_is_left_unretrieved(caplog):
    gate = asyncio.get_running_loop().create_future()
    rest = eager.start(steps([], waits_for=gate, fail_at="after"))
    waiter = asyncio.create_task(asyncio.wait_for(rest, 5))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert rest.cancelled()
    gate.set_result(None)  # the coroutine finishes (and fails) with nobody waiting
    await asyncio.sleep(0.05)
    gc.collect()
    await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text
