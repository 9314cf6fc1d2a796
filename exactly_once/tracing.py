"""OpenTelemetry spans of the toolkit (the `otel` extra: opentelemetry-api), or nothing at all.

    from exactly_once.tracing import TRACING, extract, inject, span

    with span("eventbus.enqueue", domain="scan") as current:   # current: the span, or None
        job.trace_context = inject()                            # its W3C traceparent, or ""
    with span("eventbus.run", extract(job.trace_context), job_id=str(job.id)):
        ...                                                     # a child of the enqueue's span

Tracing is on (TRACING) when the OpenTelemetry API imports, decided once, when this module is
imported; there is no setting. The spans go to the tracer provider the project sets
(`opentelemetry.trace.set_tracer_provider`, with the SDK and an exporter of its choice): without
one the API's own no-op tracer takes them, and what is left is a trace context passed along
(never a span recorded). `use_tracer_provider` gives the toolkit's spans a provider of their
own: a test's, or the API's NoOpTracerProvider to silence them alone; OTEL_SDK_DISABLED=true
silences the SDK's.

Without the API nothing of OpenTelemetry is imported, and each helper is a constant: `span()`
a shared null context (whose value is None), `inject()` "", `extract()` None. A hot path (a
publish, the router's settling, the gateway's frames) checks TRACING itself before it builds a
span's attributes, so that tracing off costs it one boolean.

What a span carries: its attributes as given (plain names: job_id, domain, stage, seq...). An
exception leaving a span is recorded on it with an ERROR status, unless it is one of the
`expected` classes: control flow, not a failure (a stage that waits, a run another holds).
The trace context crosses processes as its traceparent alone (no tracestate): with the job
(Job.trace_context), on a stream entry (a `tp` field) and on the job's pub/sub message (a last
member `tp`, which the gateway strips before it sends the frame).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace import Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:
    TRACING = False
else:
    TRACING = True

__all__ = [
    "TRACING",
    "annotate",
    "extract",
    "failed",
    "inject",
    "made_current",
    "span",
    "start",
    "use_tracer_provider",
]

# The instrumentation scope the toolkit's spans are named under.
SCOPE = "exactly_once"

# What span() gives when tracing is off: entered, it is None.
_OFF: AbstractContextManager[Any] = nullcontext()

if TRACING:
    _propagator = TraceContextTextMapPropagator()
    # A ProxyTracer until the project sets its provider, then that provider's tracer.
    _tracer = _trace.get_tracer(SCOPE)


def use_tracer_provider(provider) -> None:
    """Send the toolkit's spans to `provider` (None: back to the global one the project sets).

    Parameters
    ----------
    provider : opentelemetry.trace.TracerProvider or None
        An SDK's TracerProvider (a test's, with an in-memory exporter), the API's
        NoOpTracerProvider (the toolkit's spans silenced), or None.
    """
    global _tracer
    if not TRACING:
        return
    _tracer = _trace.get_tracer(SCOPE) if provider is None else provider.get_tracer(SCOPE)


def span(name: str, parent=None, *, expected: tuple[type[BaseException], ...] = (), **attributes):
    """A span around the block, current while it runs; a null context when tracing is off.

    Parameters
    ----------
    name : str
        The span's name ("eventbus.run", ...).
    parent : opentelemetry.context.Context, optional
        What to start it in (extract()); None: the current span's child.
    expected : tuple of exception classes, optional
        Exceptions that leave the span without marking it failed (control flow).
    **attributes
        The span's attributes (str, bool, int or float).

    Returns
    -------
    context manager
        Entered, the span (None when tracing is off).
    """
    if not TRACING:
        return _OFF
    return _span(name, parent, expected, attributes)


@contextmanager
def _span(name: str, parent, expected: tuple, attributes: dict) -> Iterator[Any]:
    with _tracer.start_as_current_span(
        name, context=parent, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except Exception as exc:
            if not isinstance(exc, expected):
                failed(current, exc)
            raise


def start(name: str, parent=None, **attributes):
    """A span started now and not made current: the caller ends it (`span.end()`). Only when
    tracing is on (the caller checks TRACING).

    Parameters
    ----------
    name : str
        The span's name.
    parent : opentelemetry.context.Context, optional
        What to start it in (extract()); None: the current span's child.
    **attributes
        The span's attributes.
    """
    return _tracer.start_span(name, context=parent, attributes=attributes)


def made_current(started) -> AbstractContextManager:
    """A span start() gave, current while the block runs and ended after it (as span() makes
    its own, without marking it failed: the caller does, with failed()). Only when tracing is on."""
    return _trace.use_span(started, end_on_exit=True, record_exception=False, set_status_on_exception=False)


def failed(current, failure: BaseException | str) -> None:
    """Mark the span failed: an exception is recorded on it, a text only describes the failure
    (a run that ended FAILED). A no-op for None (span()'s value when tracing is off).

    Parameters
    ----------
    current : opentelemetry.trace.Span or None
        The span.
    failure : BaseException or str
        The exception, or what failed.
    """
    if current is None:
        return
    if isinstance(failure, BaseException):
        current.record_exception(failure)
        failure = f"{type(failure).__name__}: {failure}"
    current.set_status(Status(StatusCode.ERROR, failure[:500]))


def annotate(**attributes) -> None:
    """Set attributes on the current span (a no-op when tracing is off, or none is current).

    Parameters
    ----------
    **attributes
        The attributes.
    """
    if TRACING:
        _trace.get_current_span().set_attributes(attributes)


def inject(current=None) -> str:
    """The W3C traceparent of a span: the current one by default; "" when tracing is off or
    there is no valid span.

    Parameters
    ----------
    current : opentelemetry.trace.Span, optional
        The span; None: the current span.

    Returns
    -------
    str
        `00-<trace id>-<span id>-<flags>`, or "".
    """
    if not TRACING:
        return ""
    context = (current if current is not None else _trace.get_current_span()).get_span_context()
    if not context.is_valid:
        return ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def extract(traceparent: str | None):
    """The context to start a child span in, from a W3C traceparent (inject()'s); None when
    tracing is off or there is none (a span started in None is the current span's child). A
    traceparent that is not one gives an empty context: the span starts a trace of its own.

    Parameters
    ----------
    traceparent : str or None
        The traceparent.

    Returns
    -------
    opentelemetry.context.Context or None
    """
    if not TRACING or not traceparent or not isinstance(traceparent, str):
        return None
    return _propagator.extract({"traceparent": traceparent})
