"""Run a coroutine at once, in the caller, as far as it goes without waiting.

A frame for each of thousands of sockets is one send each, and an ASGI server's send returns
without waiting unless the client's buffer is full (uvicorn then waits for it to drain; daphne
never waits). A task per send (or per socket, woken per frame) costs a scheduling round per
frame; this costs nothing when the send does not wait, and a task only for the rest of one
that does. (Python 3.12's `asyncio.Task(coro, eager_start=True)` does the same; 3.11 has none.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def start(coro: Coroutine[Any, Any, Any]) -> asyncio.Future | None:
    """Step `coro` here until it finishes (None) or waits (a future of the rest, run by a task
    from when what it waits for is done). An exception before it waits is raised here."""
    try:
        waits_for = coro.send(None)
    except StopIteration:
        return None
    loop = asyncio.get_running_loop()
    rest: asyncio.Future = loop.create_future()

    def resume(_=None) -> None:
        # The task's first step resumes the coroutine where it waited, past a future now done.
        task = loop.create_task(coro)
        task.add_done_callback(lambda done: _settle(rest, done))

    if waits_for is None:  # a bare yield (asyncio.sleep(0)): go on at the next turn of the loop
        loop.call_soon(resume)
    else:
        # What a task does with a future its coroutine yields: take it over, resume when done.
        waits_for._asyncio_future_blocking = False
        waits_for.add_done_callback(resume)
    return rest


def _settle(rest: asyncio.Future, task: asyncio.Task) -> None:
    if task.cancelled():
        rest.cancel()
        return
    error = task.exception()  # retrieved here: the rest's waiter may have left (its socket closed)
    if rest.done():
        return
    if error is not None:
        rest.set_exception(error)
    else:
        rest.set_result(task.result())
