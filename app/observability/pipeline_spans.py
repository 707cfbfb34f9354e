"""The pipeline's observer that follows each record with spans (``app.pipeline.observer``), made with
``app.observability.spans``: a batch's span and each record's (continuing its producer's trace), the
record's T1, calls and T3 under it, its dead letter's span; a redrive's, a person's retry's and a bulk
job chunk's spans, linked to the context the dead letter kept. A record's trace, as the pipeline
carries it, is the OpenTelemetry context of its span.

Spans are made only while tracing is on (:func:`app.observability.spans.on`): off, a batch is not
followed at all.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span

from app.observability import spans
from app.pipeline.errors import PipelineError
from app.pipeline.events import OrderEvent
from app.pipeline.model import BatchPlan, EffectJob, EventPlan, LedgerRow
from app.pipeline.observer import BatchStory, CallEnded, NoObserver
from app.pipeline.outcomes import Outcome
from app.pipeline.plan import step_keys
from app.pipeline.ports import DeadLetter, Finished, SourceRecord


class PipelineSpans(NoObserver):
    """Each record's story as spans (the T1/T3 spans carry their statement's times)."""

    follows_records = True

    def batch_began(self, records: Sequence[SourceRecord], group: str) -> BatchStory | None:
        if not spans.on() or not records:
            return None
        return _BatchSpans(records, group)

    def claimed(self, traces: Sequence[object | None], events: Sequence[OrderEvent], plan: BatchPlan,
                began_ns: int) -> None:
        spans.step_spans("T1", _contexts(traces), began_ns, lambda i: _planned(plan.events[i], events[i]))

    @contextmanager
    def calling(self, trace: object, job: EffectJob) -> Iterator[CallEnded]:
        with spans.effect_span(_context(trace), job.effect.name, job.biz_key, job.attempt) as span:
            def ended(finished: Finished) -> None:
                error = finished.error
                spans.ended(span, "done" if error is None else error.reason, error)
            yield ended

    def recorded(self, traces: Sequence[object | None], finished: Sequence[Finished], owned: set[str],
                 broken: Mapping[str, PipelineError], began_ns: int) -> None:
        spans.step_spans("T3", [_context(traces[item.job.index]) for item in finished], began_ns,
                         lambda i: _recorded(finished[i], owned, broken))

    # -- the compensator's runs ------------------------------------------------------------------------

    def redrives_began(self, rows: Sequence[LedgerRow], events: Sequence[OrderEvent], *, by_person: bool,
                       chunk: object | None) -> list[object] | None:
        """One span per row run again, linked to the context its dead letter kept (its producer's)."""
        if not spans.on():
            return None
        name = "retry dead letter" if by_person else "redrive dead letter"
        traces: list[object] = []
        for row, event in zip(rows, events):
            attrs = {"dead_letter.row_id": row.id, "error.type": row.reason, "dlq.redrives": row.redrives,
                     "idem.key": step_keys(event)[0], "order.no": event.order_no, "event.type": event.type.value}
            links = spans.link_to(spans.extract(row.headers, row.value))
            if isinstance(chunk, Span):
                span = spans.child_span(name, spans.context_of(chunk), **attrs)
                for link in links:
                    span.add_link(link.context, link.attributes)
            else:
                span = spans.root_span(name, links, **attrs)
            traces.append(spans.context_of(span))
        return traces

    def redrive_ended(self, trace: object, status: str | None, error: PipelineError | None) -> None:
        span = _span_of(trace)
        if span is not None:
            spans.ended(span, status, error)
            span.end()

    def chunk_began(self, job_id: int, action: str, rows: int) -> object | None:
        if not spans.on():
            return None
        return spans.root_span("bulk job chunk", [], **{"bulk.job_id": job_id, "bulk.action": action,
                                                        "bulk.rows": rows})

    def chunk_claimed(self, chunk: object, rows: Sequence[LedgerRow]) -> None:
        if isinstance(chunk, Span):
            for row in rows:
                for link in spans.link_to(spans.extract(row.headers, row.value), **{"dead_letter.row_id": row.id}):
                    chunk.add_link(link.context, link.attributes)

    def chunk_ended(self, chunk: object) -> None:
        if isinstance(chunk, Span):
            chunk.end()


class _BatchSpans:
    """The spans of one batch: the batch's, and each record's (continuing its producer's trace, linked
    to the batch's); a record's span ends when the batch handler says it is finished."""

    def __init__(self, records: Sequence[SourceRecord], group: str) -> None:
        parents = [spans.extract(r.headers, r.value) if r.unreadable is None else None for r in records]
        self.batch = spans.batch_span(records[0].topic, group, len(records), parents)
        self.spans = [spans.record_span(r.topic, group, r.partition, r.offset, parent, self.batch)
                      for r, parent in zip(records, parents)]
        self.open = set(range(len(records)))

    def decoded(self, index: int, event: OrderEvent) -> object | None:
        span = self.spans[index]
        span.set_attribute("order.no", event.order_no)
        span.set_attribute("event.type", event.type.value)
        return spans.context_of(span)

    def ended(self, indices: Sequence[int], outcome: str) -> None:
        for index in indices:
            spans.ended(self.spans[index], outcome)

    def dead_lettered(self, letter: DeadLetter, indices: Sequence[int]) -> DeadLetter:
        for index in indices[1:]:
            spans.ended(self.spans[index], Outcome.DEAD_LETTER, _LetterError(letter))
        return _dead_lettered(letter, self.spans[indices[0]])

    def finished(self, indices: Sequence[int]) -> None:
        for index in indices:
            if index in self.open:
                self.open.discard(index)
                self.spans[index].end()

    def closed(self) -> None:
        for index in sorted(self.open):
            self.spans[index].end()
        self.open.clear()
        self.batch.end()


def _dead_lettered(letter: DeadLetter, span: Span) -> DeadLetter:
    """``letter`` with the context of its ``dead-letter`` span (a child of its record's ``span``)."""
    spans.ended(span, Outcome.DEAD_LETTER, _LetterError(letter))
    child = spans.child_span("dead-letter", spans.context_of(span), **{
        "error.type": letter.reason, "retriable": letter.retriable, "dlq.attempts": letter.attempts,
        "idem.key": letter.biz_key, "order.no": letter.order_no})
    child.end()
    return replace(letter, trace=spans.traceparent(child))


class _LetterError(PipelineError):
    """A letter's reason, as the error a span ends with."""

    def __init__(self, letter: DeadLetter) -> None:
        super().__init__(letter.reason, reason=letter.reason)
        self.retriable = letter.retriable


def _context(trace: object) -> Context | None:
    """A record's trace as the pipeline carries it: the context of its span (or None, untraced)."""
    return trace if isinstance(trace, Context) else None


def _contexts(traces: Sequence[object | None]) -> list[Context | None]:
    return [_context(trace) for trace in traces]


def _span_of(record_trace: object) -> Span | None:
    """The span a trace of ours is the context of."""
    context = _context(record_trace)
    return None if context is None else trace.get_current_span(context)


def _planned(plan: EventPlan, event: OrderEvent) -> dict:
    """A T1 span's attributes for one event: its keys, the attempts claimed, what the plan said."""
    attrs: dict = {"idem.key": step_keys(event)[0], "order.no": event.order_no, "event.type": event.type.value}
    if plan.jobs:
        attrs["outcome"] = "claimed"
        attrs["idem.claimed"] = [job.biz_key for job in plan.jobs]
        attrs["idem.attempt"] = max(job.attempt for job in plan.jobs)
    elif plan.outcome is not None:
        attrs["outcome"] = plan.outcome.value
    elif plan.error is not None:
        attrs["outcome"] = "error"
        attrs["error.type"] = plan.error.reason
    elif plan.deferred:
        attrs["outcome"] = "deferred"
    return attrs


def _recorded(item: Finished, owned: set[str], broken: Mapping[str, PipelineError]) -> dict:
    """A T3 span's attributes for one call's outcome."""
    key = item.job.biz_key
    outcome = ("error" if key in broken else "lost_lease" if key not in owned
               else "done" if item.error is None else item.error.reason)
    return {"idem.key": key, "idem.attempt": item.job.attempt, "outcome": outcome}
