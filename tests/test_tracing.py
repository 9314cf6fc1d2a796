"""OpenTelemetry spans (exactly_once.tracing, the `otel` extra) from a request to the WebSocket
frame: the enqueue keeps its trace context with the job, and the worker's run, each stage
attempt, the publishes, the router's route and the gateway's frame join that trace, each the
child of the one before. The worker, the router and the gateway run in this process (a real
Redis, the test database, the real ASGI app), each reading the trace context where its own
process would: the job's row, the stream entry, the channel message.

The spans go to an SDK provider with an in-memory exporter given to the toolkit alone
(use_tracer_provider): the process's global provider is never set, so no other test traces.
Without the API, a process imports nothing of OpenTelemetry and runs jobs all the same:
tests/test_tracing_off.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from eventbus.bus.keys import JobKeys
from eventbus.bus.router import Router
from eventbus.job import runs
from eventbus.models import Job
from eventbus.services import retry_job, start_job
from exactly_once import tracing
from tests.processes import wait_for

SCAN_SEQS = [10, 20, 30, 40, 51]  # the scan job's events: a report per stage, then the final one


@pytest.fixture
def provider():
    provider = TracerProvider()
    yield provider
    provider.shutdown()


@pytest.fixture
def spans(provider):
    """The toolkit's spans of this test, finished ones in the exporter."""
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    yield exporter
    tracing.use_tracer_provider(None)


def named(exporter, name: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def traceparent(span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def parent_id(span) -> int | None:
    return span.parent.span_id if span.parent is not None else None


# The helpers ---------------------------------------------------------------------------------


def test_inject_and_extract_carry_a_span_across(spans):
    assert tracing.TRACING
    assert tracing.inject() == "", "no span: nothing to carry"
    assert tracing.extract("") is None and tracing.extract(None) is None
    with tracing.span("outer", kind="test") as outer:
        carried = tracing.inject()
    assert carried == traceparent(outer)
    with tracing.span("inner", tracing.extract(carried)):
        pass
    [inner] = named(spans, "inner")
    assert inner.context.trace_id == outer.context.trace_id and parent_id(inner) == outer.context.span_id
    assert named(spans, "outer")[0].attributes["kind"] == "test"
    # Not a traceparent: a trace of its own, not a failure.
    with tracing.span("stray", tracing.extract("00-nonsense")):
        pass
    [stray] = named(spans, "stray")
    assert stray.parent is None and stray.context.trace_id != outer.context.trace_id


def test_a_failure_marks_its_span_and_an_expected_exception_does_not(spans):
    with pytest.raises(ValueError), tracing.span("fails"):
        raise ValueError("boom")
    with pytest.raises(KeyError), tracing.span("control", expected=(KeyError,)):
        raise KeyError("flow")
    [fails] = named(spans, "fails")
    assert fails.status.status_code is StatusCode.ERROR and "ValueError: boom" in fails.status.description
    assert [event.name for event in fails.events] == ["exception"]
    [control] = named(spans, "control")
    assert control.status.status_code is StatusCode.UNSET and not control.events


# The request and the enqueue ---------------------------------------------------------------------


@pytest.mark.django_db
def test_an_enqueue_keeps_its_span_as_the_jobs_trace_context(spans, user):
    with tracing.span("request") as request:
        job, created = start_job("scan", {}, key="traced-1", owner=user)
    assert created
    [enqueue] = named(spans, "eventbus.enqueue")
    assert job.trace_context == traceparent(enqueue)
    assert Job.objects.get(pk=job.pk).trace_context == job.trace_context
    assert enqueue.context.trace_id == request.context.trace_id
    assert parent_id(enqueue) == request.context.span_id
    assert dict(enqueue.attributes) == {"domain": "scan", "job_id": str(job.pk), "created": True}
    # A replay of the key, in another request: the job keeps the trace that accepted it.
    with tracing.span("retry of the request"):
        again, created = start_job("scan", {}, key="traced-1", owner=user)
    assert not created and again.pk == job.pk
    assert Job.objects.get(pk=job.pk).trace_context == traceparent(enqueue)
    assert named(spans, "eventbus.enqueue")[1].attributes["created"] is False


@pytest.mark.django_db
def test_a_retry_is_accepted_in_a_span_of_its_own(spans, user, make_failed_job):
    old = make_failed_job()
    new, created = retry_job(old.pk, key="retry-traced")
    assert created
    [enqueue] = named(spans, "eventbus.enqueue")
    assert new.trace_context == traceparent(enqueue)
    assert enqueue.attributes["retry_of"] == str(old.pk) and enqueue.attributes["job_id"] == str(new.pk)


@pytest.fixture
def make_failed_job(user):
    def make():
        return Job.objects.create(
            scope=f"-:{user.pk}",
            idem_key="failed-1",
            domain="scan",
            event_type="job.requested",
            owner=user,
            state=Job.State.FAILED,
        )

    return make


@pytest.mark.django_db
def test_a_keyed_request_is_a_span_with_its_outcome_and_the_enqueue_in_it(spans, api_client):
    def post():
        return api_client.post(
            "/api/jobs/", {"domain": "scan"}, format="json", HTTP_IDEMPOTENCY_KEY="k-traced"
        )

    assert post().status_code == 201
    replayed = post()
    assert replayed.status_code == 201 and replayed["Idempotent-Replayed"] == "true"
    first, second = named(spans, "idempotency.request")
    assert (first.attributes["outcome"], second.attributes["outcome"]) == ("miss", "replay")
    assert first.attributes["method"] == "POST"
    [enqueue] = named(spans, "eventbus.enqueue")
    assert parent_id(enqueue) == first.context.span_id, "the view's enqueue is the keyed request's child"
    assert Job.objects.get().trace_context == traceparent(enqueue)


# The worker and the router, in this process -----------------------------------------------------


@pytest.fixture
def broker(redis_client, redis_url):
    """This process's Celery app sends to the test Redis (a run enqueued on commit goes there)."""
    from tests.eventbus.helpers import point_broker

    point_broker(redis_url)
    return redis_client


def channel_messages(client, channel: str):
    """A subscription to the channel, and a function that waits for `count` raw messages."""
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    wait_for(lambda: client.pubsub_numsub(channel)[0][1] == 1, message="the subscription")
    received: list[bytes] = []

    def receive(count: int) -> list[bytes]:
        def enough():
            while (message := pubsub.get_message(timeout=0.01)) is not None:
                received.append(message["data"])
            return len(received) >= count

        wait_for(enough, message=f"{count} messages on {channel}")
        return received

    return pubsub, receive


@pytest.mark.django_db(transaction=True)
def test_a_run_its_stages_publishes_and_routes_join_the_enqueues_trace(spans, user, broker):
    with tracing.span("request") as request:
        job, _ = start_job("scan", {}, key="traced-run", owner=user)
    trace_id = request.context.trace_id
    keys = JobKeys("scan", str(job.pk))
    pubsub, receive = channel_messages(broker, keys.channel)
    try:
        assert runs.run(str(job.pk)) == Job.State.COMPLETED

        [enqueue] = named(spans, "eventbus.enqueue")
        [run] = named(spans, "eventbus.run")
        assert run.context.trace_id == trace_id and parent_id(run) == enqueue.context.span_id
        assert run.attributes["outcome"] == "COMPLETED" and run.attributes["job_id"] == str(job.pk)
        stages = named(spans, "eventbus.stage")
        assert [s.attributes["stage"] for s in stages] == ["vision", "rule", "answer", "reward"]
        assert all(parent_id(s) == run.context.span_id for s in stages)
        assert all(s.attributes["outcome"] == "completed" and s.attributes["attempt"] == 1 for s in stages)
        publishes = named(spans, "eventbus.publish")
        assert [p.attributes["seq"] for p in publishes] == SCAN_SEQS
        parents = {s.context.span_id for s in stages} | {run.context.span_id}
        assert all(p.context.trace_id == trace_id and parent_id(p) in parents for p in publishes)
        assert parent_id(publishes[-1]) == run.context.span_id, "the final event: the run's own"

        # Each stream entry carries its publish span's context to the router.
        entries = broker.xrange(keys.stream)
        assert [fields[b"tp"].decode() for _, fields in entries] == [traceparent(p) for p in publishes]

        Router(burst=True, consumer="traced").run()
        routes = named(spans, "eventbus.route")
        assert [r.attributes["seq"] for r in routes] == SCAN_SEQS
        assert [parent_id(r) for r in routes] == [p.context.span_id for p in publishes]
        assert all(r.attributes["outcome"] == "applied" and r.context.trace_id == trace_id for r in routes)

        # The channel's copy carries the route span's context as its last member; the history's
        # (what a reconnecting socket reads) never does, and is that copy without it, to the byte.
        messages = receive(len(SCAN_SEQS))
        assert [json.loads(m)["tp"] for m in messages] == [traceparent(r) for r in routes]
        stored = broker.zrange(keys.history, 0, -1)
        assert all(b'"tp"' not in event for event in stored)
        assert [m[: m.rindex(b',"tp":')] + b"}" for m in messages] == stored
    finally:
        pubsub.close()


def test_a_route_call_mixes_entries_with_and_without_a_trace_context(spans, provider, redis_client):
    """Entries of publishers that trace and of ones that do not, routed in one call: each applied,
    in order, a route span and a traced channel copy for the traced ones only."""
    from opentelemetry.trace import NoOpTracerProvider

    from eventbus import publish_event

    keys = JobKeys("scan", "job-mixed")
    pubsub, receive = channel_messages(redis_client, keys.channel)
    try:
        traced_seqs = {11, 13}
        for seq in (10, 11, 12, 13):
            # A publisher whose spans are silenced passes no trace context on.
            tracing.use_tracer_provider(provider if seq in traced_seqs else NoOpTracerProvider())
            publish_event("scan", "job-mixed", "vision", seq, {"seq": seq})
        tracing.use_tracer_provider(provider)
        entries = redis_client.xrange(keys.stream)
        assert [b"tp" in fields for _, fields in entries] == [False, True, False, True]
        Router(burst=True, consumer="mixed").run()
        messages = [json.loads(m) for m in receive(4)]
        assert [m["seq"] for m in messages] == [10, 11, 12, 13]
        routes = named(spans, "eventbus.route")
        assert [r.attributes["seq"] for r in routes] == [11, 13]
        assert [m.get("tp") for m in messages] == [None, traceparent(routes[0]), None, traceparent(routes[1])]
        assert [json.loads(e)["seq"] for e in redis_client.zrange(keys.history, 0, -1)] == [10, 11, 12, 13]
    finally:
        pubsub.close()


@pytest.mark.django_db(transaction=True)
def test_a_failed_stage_and_its_run_are_marked_failed(spans, user, broker, tmp_path):
    with tracing.span("request"):
        job, _ = start_job("staged", {"log": str(tmp_path / "log"), "raise": "refused"}, key="k", owner=user)
    assert runs.run(str(job.pk)) == Job.State.FAILED
    [run] = named(spans, "eventbus.run")
    assert run.status.status_code is StatusCode.ERROR and run.attributes["outcome"] == "FAILED"
    first, second = named(spans, "eventbus.stage")
    assert first.status.status_code is StatusCode.UNSET
    assert second.attributes["outcome"] == "failed" and second.status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in second.events] == ["ValueError"]


@pytest.mark.django_db(transaction=True)
def test_a_waiting_stage_is_no_failure(spans, user, broker, tmp_path):
    job, _ = start_job(
        "durable", {"log": str(tmp_path / "log"), "skip_review": True, "sleep": 3600}, key="k", owner=user
    )
    assert runs.run(str(job.pk)) == "waiting"
    waiting = [s for s in named(spans, "eventbus.stage") if s.attributes["outcome"] == "waiting"]
    assert len(waiting) == 1 and waiting[0].status.status_code is StatusCode.UNSET
    [run] = named(spans, "eventbus.run")
    assert run.attributes["outcome"] == "waiting" and run.status.status_code is StatusCode.UNSET


# The gateway's frame, through the real ASGI app -----------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_the_gateway_frame_joins_the_trace_and_the_client_never_sees_it(spans, user, redis_client):
    from asgiref.sync import sync_to_async

    from gateway.hub import close_hub
    from gateway.sessions import close_session_watch
    from tests.gateway.conftest import login_cookie, open_socket

    cookie = await sync_to_async(login_cookie)(user)
    with tracing.span("request") as request:
        job, _ = await sync_to_async(start_job)("scan", {}, key="traced-socket", owner=user)
    socket = await open_socket(f"/ws/jobs/{job.pk}/", cookie, subscribed_to=job)
    try:

        def run_and_route():
            assert runs.run(str(job.pk), send=None) == Job.State.COMPLETED
            Router(burst=True, consumer="traced").run()

        await asyncio.get_running_loop().run_in_executor(None, run_and_route)
        frames = []
        while len(frames) < len(SCAN_SEQS):
            frames.append(await socket.receive_from(timeout=10))
        events = [json.loads(frame) for frame in frames]
        assert [e["seq"] for e in events] == SCAN_SEQS
        assert all("tp" not in e and frame.endswith('"}') for e, frame in zip(events, frames))
        routes = {r.context.span_id: r for r in named(spans, "eventbus.route")}
        frame_spans = named(spans, "gateway.frame")
        assert [f.attributes["seq"] for f in frame_spans] == SCAN_SEQS
        assert all(
            parent_id(f) in routes and f.context.trace_id == request.context.trace_id for f in frame_spans
        )
        assert all(
            f.attributes["sockets"] == 1 and f.attributes["job_id"] == str(job.pk) for f in frame_spans
        )
    finally:
        await socket.disconnect()
        await close_hub()
        await close_session_watch()
