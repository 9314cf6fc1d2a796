"""Jobs' states read from the database for many sockets at once.

After a Redis blip every socket resyncs, and each must ask the database whether its job ended
meanwhile (its final event may be lost with Redis). One query per socket is thousands of
queries, each a trip to a worker thread; the sockets that ask while a query is being made share
the next one instead (eventbus.selectors.job_states: `pk IN (...)`), one per loop and batch.
"""

from __future__ import annotations

import asyncio
import weakref

from channels.db import database_sync_to_async

from eventbus.selectors import job_states

_states = database_sync_to_async(job_states)


class StateReader:
    def __init__(self):
        self._wanted: dict[object, asyncio.Future] = {}
        self._reader: asyncio.Task | None = None

    def state(self, pk) -> asyncio.Future:
        """A future of the job's state (None: no such job any more), shared by whoever asks
        before the next query is sent: add a done callback to it, never cancel it."""
        future = self._wanted.get(pk)
        if future is None:
            future = self._wanted[pk] = asyncio.get_running_loop().create_future()
            if self._reader is None or self._reader.done():
                self._reader = asyncio.get_running_loop().create_task(self._read())
        return future

    async def _read(self) -> None:
        while self._wanted:
            wanted, self._wanted = self._wanted, {}  # who asks from now on waits for the next query
            try:
                states = await _states(list(wanted))
            except Exception as exc:
                for future in wanted.values():
                    future.set_exception(exc)
                    future.exception()  # retrieved here: an asker that left must not log it
                continue
            for pk, future in wanted.items():
                future.set_result(states.get(pk))


_readers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, StateReader] = weakref.WeakKeyDictionary()


def job_state(pk) -> asyncio.Future:
    """A future of the job's state, read with the other sockets' of this process that ask
    meanwhile (StateReader.state): the sockets of 1,000 jobs after a blip cost two queries, and
    no task or waiter each."""
    loop = asyncio.get_running_loop()
    reader = _readers.get(loop)
    if reader is None:
        reader = _readers[loop] = StateReader()
    return reader.state(pk)
