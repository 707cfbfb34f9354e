"""Spans, with the OpenTelemetry API only: no-ops until ``app.observability.tracing`` installs an SDK
and calls :func:`enable` (tracing off costs one boolean test per batch and per call). The pipeline's
observer that makes them is ``app.observability.pipeline_spans``.

What a record's trace holds (the producer's, continued from its ``traceparent``/``tracestate``
headers, or the CloudEvents ``traceparent`` extension)::

    process order-event          the record (CONSUMER), linked to its batch's span
      T1                         the claim: t_idem keys, their attempts, what the plan said
      effect <name>              each call: t_idem key, attempt, outcome
        POST                     the HTTP call (the aiohttp instrumentation): traceparent to the provider
      T3                         the record of the outcomes
      dead-letter                the letter (its context rides along in the ``dlq.traceparent`` header)

A batch is one span of its own (``process order-event``, the batch size and group), linked to every
record's producer context (messaging semantic conventions: a batch has many parents). A redrive of a
dead letter, a person's retry and a bulk job's chunk are spans of their own traces, linked to the
original context the dead letter kept. No personal data goes into a span: keys, attempts, outcomes,
reasons, offsets and order numbers only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson
from opentelemetry import propagate, trace
from opentelemetry.context import _SUPPRESS_HTTP_INSTRUMENTATION_KEY, Context, attach, detach, set_value
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from app.pipeline.errors import PipelineError

SYSTEM = "kafka"
_tracer = trace.get_tracer("order_event_processor")
_on = False

# The W3C trace context headers, as a producer writes them; CloudEvents' binary mode puts its
# distributed tracing extension in ``ce_traceparent``/``ce_tracestate``.
TRACE_HEADERS = ("traceparent", "tracestate")
CE_JSON = b"application/cloudevents+json"


def enable() -> None:
    global _on
    _on = True


def disable() -> None:
    global _on
    _on = False


def on() -> bool:
    return _on


# -- contexts from records ------------------------------------------------------------------------------


class _Headers(Getter[dict[str, str]]):
    def get(self, carrier: dict[str, str], key: str) -> list[str] | None:
        value = carrier.get(key)
        return None if value is None else [value]

    def keys(self, carrier: dict[str, str]) -> list[str]:
        return list(carrier)


_GETTER = _Headers()


def carrier(headers: Iterable[tuple[str, bytes | None]], value: bytes | None = None) -> dict[str, str]:
    """The trace context fields a record carries: its ``traceparent``/``tracestate`` headers, else the
    CloudEvents extension's (``ce_traceparent``, or the structured event's ``traceparent`` attribute)."""
    found: dict[str, str] = {}
    ce: dict[str, str] = {}
    structured = False
    for key, raw in headers:
        if raw is None or not isinstance(key, str):
            continue
        low = key.lower()
        if low in TRACE_HEADERS:
            found[low] = raw.decode("latin-1")
        elif low.startswith("ce_") and low[3:] in TRACE_HEADERS:
            ce[low[3:]] = raw.decode("latin-1")
        elif low == "content-type" and raw.lower().startswith(CE_JSON):
            structured = True
    if "traceparent" in found:
        return found
    if "traceparent" in ce:
        return ce
    if structured and value:
        try:
            doc = orjson.loads(value)
        except orjson.JSONDecodeError:
            return found
        if isinstance(doc, dict):
            return {name: doc[name] for name in TRACE_HEADERS if isinstance(doc.get(name), str)}
    return found


def extract(headers: Iterable[tuple[str, bytes | None]], value: bytes | None = None) -> Context | None:
    """The producer's context of a record, if it carries one (and it is valid)."""
    fields = carrier(headers, value)
    if not fields:
        return None
    context = propagate.extract(fields, getter=_GETTER)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def link_to(context: Context | None, **attributes: Any) -> list[Link]:
    if context is None:
        return []
    span_context = trace.get_current_span(context).get_span_context()
    return [Link(span_context, attributes or None)] if span_context.is_valid else []


def traceparent(span: Span) -> str | None:
    """The W3C ``traceparent`` of ``span`` (for a header), if it is a real one."""
    fields: dict[str, str] = {}
    propagate.inject(fields, context=trace.set_span_in_context(span))
    return fields.get("traceparent")


def context_of(span: Span | None) -> Context | None:
    return None if span is None else trace.set_span_in_context(span)


# -- the spans ------------------------------------------------------------------------------------------


def batch_span(topic: str, group: str, size: int, parents: Sequence[Context | None]) -> Span:
    """A batch of ``size`` records, linked to its records' producer contexts."""
    links = [link for parent in parents for link in link_to(parent)]
    return _tracer.start_span(f"process {topic}", kind=SpanKind.CONSUMER, links=links, attributes={
        "messaging.system": SYSTEM, "messaging.operation.type": "process", "messaging.operation.name": "process",
        "messaging.destination.name": topic, "messaging.consumer.group.name": group,
        "messaging.batch.message_count": size})


def record_span(topic: str, group: str, partition: int, offset: int, parent: Context | None,
                batch: Span | None, *, name: str | None = None, **attributes: Any) -> Span:
    """One record's processing, continuing its producer's trace, linked to its batch."""
    attrs: dict[str, Any] = {
        "messaging.system": SYSTEM, "messaging.operation.type": "process", "messaging.operation.name": "process",
        "messaging.destination.name": topic, "messaging.consumer.group.name": group,
        "messaging.destination.partition.id": str(partition), "messaging.kafka.offset": offset}
    attrs.update({key: value for key, value in attributes.items() if value is not None})
    links = [Link(batch.get_span_context())] if batch is not None and batch.get_span_context().is_valid else []
    span = _tracer.start_span(name or f"process {topic}", context=parent or Context(), kind=SpanKind.CONSUMER,
                              links=links)
    if span.is_recording():          # an unsampled record's span only carries its context on
        span.set_attributes(attrs)
    return span


def root_span(name: str, links: Sequence[Link], **attributes: Any) -> Span:
    """A span that starts a trace of its own (a redrive, a person's action, a bulk chunk), linked to the
    contexts it works for."""
    return _tracer.start_span(name, context=Context(), kind=SpanKind.INTERNAL, links=list(links),
                              attributes={key: value for key, value in attributes.items() if value is not None})


def child_span(name: str, parent: Context | None, **attributes: Any) -> Span:
    return _tracer.start_span(name, context=parent or Context(), attributes={
        key: value for key, value in attributes.items() if value is not None})


def recording(parent: Context | None) -> bool:
    """Whether spans under ``parent`` are kept (its trace sampled); an unsampled one needs none of its own."""
    return parent is not None and trace.get_current_span(parent).is_recording()


def step_spans(name: str, parents: Sequence[Context | None], started_ns: int,
               attributes: Callable[[int], dict], ended_ns: int | None = None) -> None:
    """One span per event of a statement that served many (T1, T3), with the statement's times: each
    event's trace shows the statement its step waited for. ``attributes(i)``: the ``i``-th one's, asked
    only of those whose trace is sampled."""
    ended = ended_ns if ended_ns is not None else time.time_ns()
    for at, parent in enumerate(parents):
        if not recording(parent):
            continue
        attrs = attributes(at)
        span = _tracer.start_span(name, context=parent, start_time=started_ns,
                                  attributes={"db.system.name": "mysql", **attrs})
        if attrs.get("outcome") == "error":
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=ended)


@contextmanager
def effect_span(parent: Context | None, effect: str, key: str, attempt: int) -> Iterator[Span | None]:
    """The call of one effect, current while it is made (so that the HTTP client's span is its child and
    the provider gets its ``traceparent``)."""
    if not _on or parent is None:
        yield None
        return
    if not recording(parent):
        # Unsampled: no span of ours, and none of the HTTP client's instrumentation (which costs about
        # as much as the call's own work); the call still carries the trace, "not sampled", on
        # (``app.observability.tracing``'s trace config injects it).
        token = attach(set_value(_SUPPRESS_HTTP_INSTRUMENTATION_KEY, True, parent))
        try:
            yield None
        finally:
            detach(token)
        return
    with _tracer.start_as_current_span(f"effect {effect}", context=parent, kind=SpanKind.INTERNAL,
                                       record_exception=False, set_status_on_exception=True,
                                       attributes={"effect.name": effect, "idem.key": key,
                                                   "idem.attempt": attempt}) as span:
        yield span


def ended(span: Span | None, outcome: str | None, error: PipelineError | None = None) -> None:
    """Mark how the work of ``span`` ended: its outcome, and the error's reason (never its message: it
    may quote a record)."""
    if span is None or outcome is None:
        return
    span.set_attribute("outcome", outcome)
    if error is not None:
        span.set_attribute("error.type", error.reason)
        span.set_attribute("retriable", bool(error.retriable))
        span.set_status(Status(StatusCode.ERROR, error.reason))


def now_ns() -> int:
    return time.time_ns()
