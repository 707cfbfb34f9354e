"""The pipeline's one observer port: where it reports what happened, and nothing comes back to it but
an observer's own trace of a record, which the pipeline carries without looking into it.

Three implementations plug in at the composition root (``app.bootstrap``): the metrics count
(``app.observability.metrics``), the spans follow each record from its batch through T1, its calls
and T3 to its end or its dead letter (``app.observability.pipeline_spans``), and a chaos run kills the
process at a cut point (``app.chaos``). :class:`Observers` tells several at once. So the pure core
imports neither prometheus-client nor OpenTelemetry.

An observer subclasses :class:`NoObserver` and overrides what it listens to. The reports of a
record's story (below the counts) are made only for a batch an observer follows (``batch_began``
returns how), or for runs the caller hands traces to: a worker without tracing pays one call per
batch and one test per call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

from app.pipeline.breaker import Change
from app.pipeline.errors import PipelineError
from app.pipeline.events import OrderEvent
from app.pipeline.model import BatchPlan, EffectJob, LedgerRow
from app.pipeline.ports import DeadLetter, Finished, SourceRecord

CallEnded = Callable[[Finished], None]


class BatchStory(Protocol):
    """One batch's records as an observer follows them (:meth:`Observer.batch_began`), by their index
    in the batch."""

    def decoded(self, index: int, event: OrderEvent) -> object | None:
        """Record ``index`` is ``event``: its trace, the parent of its T1, calls and T3 (``Processor.run``'s
        ``traces``)."""
        ...

    def ended(self, indices: Sequence[int], outcome: str) -> None:
        """Records ``indices`` ended with ``outcome`` (they are finished later: :meth:`finished`)."""
        ...

    def dead_lettered(self, letter: DeadLetter, indices: Sequence[int]) -> DeadLetter:
        """Records ``indices`` end in ``letter`` (the first one's; it stands for the others): the letter
        as it is sent, naming the trace that dead-lettered it (``DeadLetter.trace``)."""
        ...

    def finished(self, indices: Sequence[int]) -> None:
        """Records ``indices`` are finished: their outcomes committed, or their letters sent."""
        ...

    def closed(self) -> None:
        """The batch is over, or broke off: a record not finished by now is not finished here."""
        ...


class Observer(Protocol):
    """What the pipeline reports (every method of :class:`NoObserver`)."""

    follows_records: bool

    def planned(self, plan: BatchPlan) -> None: ...
    def paced(self, effect: str, waited: float, *, rate_limited: float | None = None) -> None: ...
    def breaker(self, effect: str, change: Change) -> None: ...
    def cut(self, point: str) -> None: ...
    def batch_began(self, records: Sequence[SourceRecord], group: str) -> BatchStory | None: ...
    def claimed(self, traces: Sequence[object | None], events: Sequence[OrderEvent], plan: BatchPlan,
                began_ns: int) -> None: ...
    def calling(self, trace: object, job: EffectJob) -> AbstractContextManager[CallEnded]: ...
    def recorded(self, traces: Sequence[object | None], finished: Sequence[Finished], owned: set[str],
                 broken: Mapping[str, PipelineError], began_ns: int) -> None: ...
    def redrives_began(self, rows: Sequence[LedgerRow], events: Sequence[OrderEvent], *, by_person: bool,
                       chunk: object | None) -> list[object] | None: ...
    def redrive_ended(self, trace: object, status: str | None, error: PipelineError | None) -> None: ...
    def chunk_began(self, job_id: int, action: str, rows: int) -> object | None: ...
    def chunk_claimed(self, chunk: object, rows: Sequence[LedgerRow]) -> None: ...
    def chunk_ended(self, chunk: object) -> None: ...


def _no_end(finished: Finished) -> None:
    pass


class NoObserver:
    """Hears everything and does nothing: the base of every observer, the default of a processor."""

    # Whether it follows each record's story (its traces are its own: at most one observer of a
    # process follows records, :class:`Observers`).
    follows_records = False

    # -- what is counted --------------------------------------------------------------------------

    def planned(self, plan: BatchPlan) -> None:
        """A T1 committed ``plan``: its claims by result (``plan.claims``) and replayed events."""

    def paced(self, effect: str, waited: float, *, rate_limited: float | None = None) -> None:
        """A call of ``effect`` waited ``waited`` seconds for its provider limits (``app.pipeline.limits``);
        ``rate_limited``: the provider then answered "not yet" for that many seconds (429)."""

    def breaker(self, effect: str, change: Change) -> None:
        """The breaker of ``effect``'s provider opened or closed (``app.pipeline.breaker``)."""

    def cut(self, point: str) -> None:
        """A run passed cut point ``point`` of its timeline (``app.pipeline.processor.run``: before_a,
        a_b, looked_up, b_c, after_c)."""

    # -- a record's story: ``trace`` is an observer's own context of one record ---------------------

    def batch_began(self, records: Sequence[SourceRecord], group: str) -> BatchStory | None:
        """A batch of ``records`` began: how this observer follows them; None: it does not (the batch
        then reports nothing of them, and its runs carry no trace)."""
        return None

    def claimed(self, traces: Sequence[object | None], events: Sequence[OrderEvent], plan: BatchPlan,
                began_ns: int) -> None:
        """T1 of ``events`` (traced ``traces``), begun at ``began_ns`` (wall clock, ns), committed ``plan``."""

    def calling(self, trace: object, job: EffectJob) -> AbstractContextManager[CallEnded]:
        """The call of ``job`` for a traced record, made inside the block (the HTTP client's work is the
        trace's then), which is told how the call ended."""
        return nullcontext(_no_end)

    def recorded(self, traces: Sequence[object | None], finished: Sequence[Finished], owned: set[str],
                 broken: Mapping[str, PipelineError], began_ns: int) -> None:
        """T3 of ``finished`` (the records of their jobs' indices into ``traces``), begun at ``began_ns``:
        the keys still ``owned``, those whose outcome could not be written (``broken``)."""

    # -- the compensator's runs ------------------------------------------------------------------------

    def redrives_began(self, rows: Sequence[LedgerRow], events: Sequence[OrderEvent], *, by_person: bool,
                       chunk: object | None) -> list[object] | None:
        """Ledger ``rows`` run again (``events``: their events), by the compensator or a person, within a
        bulk job's ``chunk`` (its trace, or None): each run's trace, linked to the context its dead letter
        kept; None: not followed."""
        return None

    def redrive_ended(self, trace: object, status: str | None, error: PipelineError | None) -> None:
        """A run of :meth:`redrives_began` ended: the row's new ``status`` (None: it broke off)."""

    def chunk_began(self, job_id: int, action: str, rows: int) -> object | None:
        """A bulk job's chunk of ``rows`` rows began: its trace, or None."""
        return None

    def chunk_claimed(self, chunk: object, rows: Sequence[LedgerRow]) -> None:
        """The chunk claimed ``rows``: it works for what their dead letters kept."""

    def chunk_ended(self, chunk: object) -> None:
        """The chunk is over."""


class Observers(NoObserver):
    """Several observers told the same: each hears the counts and the cut points; a record's story goes
    to the one that follows records."""

    def __init__(self, *observers: Observer) -> None:
        self.each = observers
        following = [observer for observer in observers if observer.follows_records]
        if len(following) > 1:
            raise ValueError("one observer at most follows records: each trace is its own")
        self.story: Observer = following[0] if following else NoObserver()
        self.follows_records = bool(following)

    def planned(self, plan: BatchPlan) -> None:
        for observer in self.each:
            observer.planned(plan)

    def paced(self, effect: str, waited: float, *, rate_limited: float | None = None) -> None:
        for observer in self.each:
            observer.paced(effect, waited, rate_limited=rate_limited)

    def breaker(self, effect: str, change: Change) -> None:
        for observer in self.each:
            observer.breaker(effect, change)

    def cut(self, point: str) -> None:
        for observer in self.each:
            observer.cut(point)

    def batch_began(self, records: Sequence[SourceRecord], group: str) -> BatchStory | None:
        return self.story.batch_began(records, group)

    def claimed(self, traces: Sequence[object | None], events: Sequence[OrderEvent], plan: BatchPlan,
                began_ns: int) -> None:
        self.story.claimed(traces, events, plan, began_ns)

    def calling(self, trace: object, job: EffectJob) -> AbstractContextManager[CallEnded]:
        return self.story.calling(trace, job)

    def recorded(self, traces: Sequence[object | None], finished: Sequence[Finished], owned: set[str],
                 broken: Mapping[str, PipelineError], began_ns: int) -> None:
        self.story.recorded(traces, finished, owned, broken, began_ns)

    def redrives_began(self, rows: Sequence[LedgerRow], events: Sequence[OrderEvent], *, by_person: bool,
                       chunk: object | None) -> list[object] | None:
        return self.story.redrives_began(rows, events, by_person=by_person, chunk=chunk)

    def redrive_ended(self, trace: object, status: str | None, error: PipelineError | None) -> None:
        self.story.redrive_ended(trace, status, error)

    def chunk_began(self, job_id: int, action: str, rows: int) -> object | None:
        return self.story.chunk_began(job_id, action, rows)

    def chunk_claimed(self, chunk: object, rows: Sequence[LedgerRow]) -> None:
        self.story.chunk_claimed(chunk, rows)

    def chunk_ended(self, chunk: object) -> None:
        self.story.chunk_ended(chunk)
