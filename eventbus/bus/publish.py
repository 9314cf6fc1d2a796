"""L1: publish job events to their shard stream exactly once, in seq order (publish.lua).

    publish_event("scan", job_id, "vision", 10, {"progress": 0.5})  # True: published
    publish_event("scan", job_id, "vision", 10, {"progress": 0.5})  # False: duplicate
    publish_events([Event("scan", job_id, "vision", 11, {...}), ...])  # one round trip

A task that runs again republishes the same (stage, seq): the dedup key drops the copy. A new
event whose seq is not above the job's last published seq is refused (OutOfOrderEvent): the
router applies a job's events strictly after their predecessor, so it must not be written.

With EVENTBUS["WAIT_REPLICAS"] (1 under Sentinel), a publish returns only once the replicas
have the events; otherwise it raises NotReplicated (a redis TimeoutError: retried like a lost
connection), so a failover cannot lose an event a job went past.

A key of the job found holding the wrong type raises CorruptKey (naming the key), with nothing
of that event written; in a batch, the job's later events are held back too (never published
past the gap), so the whole batch can be published again once the key is repaired.

With tracing on (exactly_once.tracing) a publish is an "eventbus.publish" span, whose trace
context the stream entries carry (a `tp` field) to the router; off, it costs one boolean.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from redis.exceptions import ResponseError

from eventbus import metrics
from eventbus.bus.events import MAX_SEQ, encode_data, event_head
from eventbus.bus.keys import JobKeys
from eventbus.bus.scripts import PUBLISH, CorruptKey, ScriptCall, run_pipelined  # noqa: F401 (CorruptKey, raised)
from eventbus.conf import eventbus_settings
from eventbus.jobtypes import UnknownJobType
from eventbus.redis.clients import get_redis, wait_replicas
from exactly_once.tracing import TRACING, failed, inject, made_current, start


class Event(NamedTuple):
    domain: str
    job_id: str
    stage: str
    seq: int
    data: Any


class InvalidEvent(ValueError):
    """The event cannot be published as given (unknown domain, bad seq, data not JSON...)."""


class OutOfOrderEvent(ValueError):
    """A new event whose seq is not above the job's last published seq.

    Parameters
    ----------
    event : Event
        The event refused (the first, in a batch).
    last_seq : int
        The job's last published seq.
    results : list, optional
        publish_events: what happened to each event of the batch (None: refused).
    """

    def __init__(self, event: Event, last_seq: int, results: list | None = None):
        self.event, self.last_seq = event, last_seq
        # publish_events: what happened to each event of the batch (None: refused).
        self.results = results
        super().__init__(
            f"Event seq {event.seq} ({event.stage}) of {event.domain} job {event.job_id} refused: "
            f"the job's last published seq is {last_seq}; a job's events are published in increasing seq."
        )


def _prepare(
    event: Event, previous: dict, traceparent: str = "", later: bool = True
) -> tuple[ScriptCall, tuple[str, str]]:
    """The script call of a valid event, and its metric labels; InvalidEvent otherwise.

    `previous` maps each job of the batch to the seq of its last event so far (updated here).
    `traceparent` (tracing on): the publish's span, which the stream entry carries (its `tp`).
    `later`: the call built as it is sent (a batch's), else now (a single event's)."""
    domain, job_id, stage, seq, data = event
    job_id = str(job_id)
    try:
        keys = JobKeys(domain, job_id)
    except UnknownJobType as exc:
        raise InvalidEvent(str(exc)) from None
    if not job_id:
        raise InvalidEvent("job_id is empty")
    if not isinstance(stage, str) or not stage:
        raise InvalidEvent(f"stage must be a non-empty string, not {stage!r}")
    if type(seq) is not int or not 0 < seq <= MAX_SEQ:
        raise InvalidEvent(f"seq must be an int > 0 and <= 2**53, not {seq!r}")
    try:
        data_json = encode_data(data)
    except (TypeError, ValueError) as exc:
        raise InvalidEvent(f"data of seq {seq} is not JSON-serialisable: {exc}") from None
    after = previous.get((domain, job_id), "")
    previous[domain, job_id] = seq

    def build() -> tuple[tuple, tuple]:
        settings = eventbus_settings
        head = event_head(domain=domain, job_id=job_id, stage=stage, seq=seq, data_json=data_json)
        args: tuple = (
            seq,
            settings.STREAM_MAXLEN,
            settings.DEDUP_TTL,
            settings.STATE_TTL,
            job_id,
            domain,
            stage,
            data_json,
            head,
            after,
        )
        return (
            (keys.published(stage, seq), keys.last_published, keys.state, keys.stream),
            (*args, traceparent) if traceparent else args,
        )

    # Validated now, built as it is sent (ScriptCall).
    call = PUBLISH.call_later(build) if later else PUBLISH.call(*build())
    return call, (domain, str(keys.shard))


def _out_of_order(error: Exception) -> int | None:
    """The job's last seq when the error is publish.lua's OUTOFORDER reply."""
    if isinstance(error, ResponseError) and str(error).startswith("OUTOFORDER "):
        return int(str(error).split()[1])
    return None


def _publish(batch: list[Event]) -> list:
    """Run the batch (validated first, all of it); a bool per event, None where refused."""
    if TRACING:
        first = batch[0]
        current = start(
            "eventbus.publish",
            domain=str(first.domain),
            job_id=str(first.job_id),
            stage=str(first.stage),
            seq=first.seq if type(first.seq) is int else -1,
            events=len(batch),
        )
        if not current.is_recording():
            # No provider set (the API's no-op tracer: the current span again), or sampled out:
            # nothing to record or end, only its traceparent to carry. Making it current as
            # span() does costs a single publish ~5 us, as much as all the rest of its Python.
            return _run(batch, inject(current))
        with made_current(current):
            try:
                return _run(batch, inject())
            except Exception as exc:
                failed(current, exc)  # as span() does
                raise
    return _run(batch, "")


def _count(labels: tuple[str, str], published: bool, n: int) -> None:
    if published:
        metrics.child(metrics.PUBLISHED, *labels).inc(n)
    else:
        metrics.child(metrics.DUPLICATES, *labels, "L1").inc(n)


def _run_one(event: Event, traceparent: str) -> list:
    """_run for a batch of one event (a worker's publish_event): the same, without a batch's
    bookkeeping (a tenth of a single publish's Python)."""
    call, labels = _prepare(event, {}, traceparent, later=False)
    [reply] = run_pipelined(
        get_redis(), (call,), replicas=wait_replicas(), wait_ms=eventbus_settings.WAIT_TIMEOUT_MS
    )
    if isinstance(reply, Exception):
        last_seq = _out_of_order(reply)
        if last_seq is None:
            raise reply
        raise OutOfOrderEvent(event, last_seq, results=[None])
    _count(labels, reply == 1, 1)
    return [reply == 1]


def _run(batch: list[Event], traceparent: str) -> list:
    if len(batch) == 1:
        return _run_one(batch[0], traceparent)
    previous: dict = {}
    prepared = [_prepare(event, previous, traceparent) for event in batch]
    replies = run_pipelined(
        get_redis(),
        [call for call, _ in prepared],
        replicas=wait_replicas(),
        wait_ms=eventbus_settings.WAIT_TIMEOUT_MS,
    )
    results: list = []
    counts: dict = {}
    refused = failed = None
    for event, (_, labels), reply in zip(batch, prepared, replies):
        if isinstance(reply, Exception):
            results.append(None)
            last_seq = _out_of_order(reply)
            if last_seq is not None:
                refused = refused or (event, last_seq)
            else:
                # The first failure is the cause (a CorruptKey...); the job's events after it in
                # the batch answered BLOCKED.
                failed = failed or reply
            continue
        results.append(reply == 1)
        counts[labels, reply == 1] = counts.get((labels, reply == 1), 0) + 1
    for (labels, published), n in counts.items():
        _count(labels, published, n)
    if failed:
        raise failed
    if refused:
        raise OutOfOrderEvent(*refused, results=results)
    return results


def publish_event(domain: str, job_id: str, stage: str, seq: int, data: Any) -> bool:
    """Publish one event.

    Parameters
    ----------
    domain : str
        The job's type (its name, called `domain` on the wire).
    job_id : str
        The job's id.
    stage : str
        The stage the event belongs to.
    seq : int
        The event's seq: above the job's last published one.
    data : Any
        The event's data, JSON-serialisable.

    Returns
    -------
    bool
        True when published, False when it was a duplicate.

    Raises
    ------
    InvalidEvent
        When the event cannot be published as given.
    OutOfOrderEvent
        When its seq is not above the job's last published seq.
    """
    try:
        [published] = _publish([Event(domain, job_id, stage, seq, data)])
    except OutOfOrderEvent as exc:
        raise OutOfOrderEvent(exc.event, exc.last_seq) from None
    return published


def publish_events(events: Iterable[Event | tuple | Mapping]) -> list[bool]:
    """Publish many events in one round trip, in their order.

    Parameters
    ----------
    events : iterable of Event, tuple or mapping
        The events, each as publish_event's arguments.

    Returns
    -------
    list of bool
        A bool per event as publish_event: True when published, False for a duplicate.

    Raises
    ------
    InvalidEvent
        Before anything is sent: every event is validated first.
    OutOfOrderEvent
        After the batch ran, for an event whose seq is not above the job's last.
    CorruptKey
        After the batch ran, for a corrupt key.

    Notes
    -----
    Every event is validated before anything is sent. A duplicate inside the batch is dropped
    like any other (the scripts run one after the other). An out-of-order event raises
    OutOfOrderEvent after the batch ran; its `results` tell what happened to each event. A
    corrupt key raises CorruptKey after the batch ran: the events before it were published, the
    job's events after it were not; publish the batch again once the key is repaired.
    """
    batch = [Event(**e) if isinstance(e, Mapping) else Event(*e) for e in events]
    return _publish(batch) if batch else []
