"""A reconcile run: the input topic over a time range, read ``read_committed`` outside the group,
a chunk of records at a time, each judged from the tables (``app.reconcile.input``); then the
providers' records against our receipts, where a provider can list them; the report stored in
``t_reconcile_run`` and counted in the ``order_reconcile_*`` metrics.

What a run costs: one read of the range from Kafka, and per chunk of ``chunk`` records three
indexed reads (``t_idem`` by key, the ledger by offsets, the waybill receipts by order). Its
memory is a chunk's records and, per partition, the requests seen (an order's events share a
partition), never the range's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.observability import metrics
from app.pipeline.envelopes import Reading
from app.pipeline.errors import MalformedEvent, UnhandledType
from app.pipeline.events import decode
from app.pipeline.steps import PIPELINES
from app.reconcile.input import End, Read, Tally, Verdict, judge, ledger_strays
from app.reconcile.ports import OpenRange, Record, RunStore, Span, TopicRange
from app.reconcile.report import Report

log = logging.getLogger(__name__)

# The providers' side of a run: ``(since, until, run_id) -> (its section as a dict, its findings count)``
# (the composition root's: each provider's records against our receipts, the findings filed as cases).
Providers = Callable[[datetime, datetime, int | None], Awaitable[tuple[dict[str, Any], int]]]


def read_of(record: Record, *, reading: Reading, max_bytes: int, receipt_effects: Collection[str]) -> Read:
    """What a record is to the reconcile: its request and its steps' keys (those of ``receipt_effects``
    have a receipt row), a type skipped, or why it is malformed. The pipeline's own decoding, so that
    both read a record alike."""
    try:
        event = decode(record.key, record.value, max_bytes=max_bytes, headers=record.headers or (),
                       timestamp_ms=record.timestamp, reading=reading)
    except UnhandledType as exc:
        if reading.skip_unhandled:
            return Read(skipped_type=exc.type_name)
        return Read(malformed=exc.reason)
    except MalformedEvent as exc:
        return Read(malformed=exc.reason)
    pipe = PIPELINES[event.type]
    effects = tuple((pipe.key(event, step), step.effect.name) for step in pipe.effects)
    return Read(order_no=event.order_no, type=event.type.value, local_key=pipe.key(event, pipe.local),
                effect_keys=tuple(key for key, _ in effects),
                receipt_keys=frozenset(key for key, effect in effects if effect in receipt_effects))


@dataclass(frozen=True, slots=True)
class Judging:
    """How a run reads and judges each record: as the workers decode it (their ``reading`` and their
    bound on an event's size), and how long a step may stay pending before it is stuck."""
    reading: Reading
    max_event_bytes: int
    stuck_after: float


class Reconciler:
    def __init__(self, reads: RunStore, open_range: OpenRange, judging: Judging, *, group: str, topic: str,
                 chunk: int = 2000, keep_findings: int = 1000, providers: Providers | None = None) -> None:
        """``reads``: the tables (``app.adapters.mysql.reconcile``); ``open_range``: the topic over a time
        range (``app.adapters.kafka.ranges``); ``providers``: the providers' side of a run, or None.
        ``on_verdict`` (set it before a run): told every record's end, ``(partition, offset, verdict, read)``."""
        self.reads, self.open_range, self.judging, self.group, self.topic = reads, open_range, judging, group, topic
        self.chunk, self.keep_findings, self.providers = chunk, keep_findings, providers
        self.on_verdict: Callable[[int, int, Verdict, Read], object] | None = None
        self.timings = {"kafka": 0.0, "database": 0.0}     # of the latest run: seconds waited on each

    async def run(self, since: datetime, until: datetime, *, started_by: str, store: bool = True) -> Report:
        since, until = _utc(since), _utc(until)
        report = Report(self.group, self.topic, since, until, started_by, tally=Tally(keep=self.keep_findings),
                        foreign=self.judging.reading.foreign)
        self.timings = report.waited = {"kafka": 0.0, "database": 0.0}
        clock = time.monotonic()
        if store:
            report.run_id = await self.reads.begin(self.topic, since, until, started_by)
        try:
            async with self.open_range(self.topic, _ms(since), _ms(until), chunk=self.chunk) as topic:
                committed = await topic.committed(self.group)
                for span in topic.spans:
                    report.partitions.append({"partition": span.partition, "start": span.start, "end": span.end,
                                              "committed": committed.get(span.partition)})
                    await self._span(topic, span, committed.get(span.partition), report.tally)
            if self.providers is not None:
                report.providers, report.provider_findings = await self.providers(since, until, report.run_id)
                failed = {effect: side["error"] for effect, side in report.providers.get("effects", {}).items()
                          if side.get("error")}
                if failed:           # the input is judged, but the providers' side is not: not complete
                    report.error = "the providers' records could not be read: " + "; ".join(
                        f"{effect}: {why}" for effect, why in failed.items())
        except Exception as exc:
            report.error = f"{exc.__class__.__name__}: {exc}"
            log.exception("reconcile of %s .. %s failed", since.isoformat(), until.isoformat())
        report.seconds = time.monotonic() - clock
        _count(report)
        if store and report.run_id is not None:
            await self.reads.finish(report.run_id, status=report.status, records=report.tally.records,
                                    findings=report.findings, report=report.as_dict(), summary=report.summary())
        return report

    async def _span(self, topic: TopicRange, span: Span, committed: int | None, tally: Tally) -> None:
        seen: set[tuple[str, str]] = set()
        covered = span.start               # the ledger rows of offsets before this were looked at
        chunks = aiter(topic.read(span))
        while True:
            clock = time.monotonic()
            records = await anext(chunks, None)
            self.timings["kafka"] += time.monotonic() - clock
            if records is None:
                break
            end = records[-1].offset + 1
            await self._chunk(records, span.partition, committed, covered, end, seen, tally)
            covered = end
        if covered < span.end:             # after the last record: markers, aborted records
            await self._chunk([], span.partition, committed, covered, span.end, seen, tally)

    async def _chunk(self, records: Sequence[Record], partition: int, committed: int | None, start: int, end: int,
                     seen: set[tuple[str, str]], tally: Tally) -> None:
        judging = self.judging
        reads = [read_of(r, reading=judging.reading, max_bytes=judging.max_event_bytes,
                         receipt_effects=self.reads.receipt_effects) for r in records]
        keys = [k for read in reads for k in (read.local_key, *read.effect_keys) if k]
        clock = time.monotonic()
        steps, receipts, ledger = await asyncio.gather(      # three connections of the pool, at once
            self.reads.steps(keys), self.reads.waybill_receipts(read.order_no for read in reads if read.receipt_keys and read.order_no),
            self.reads.ledger(self.topic, partition, start, end))
        self.timings["database"] += time.monotonic() - clock
        at: dict[int, list[dict[str, Any]]] = {}
        for row in ledger:
            at.setdefault(row["src_offset"], []).append(row)
        for record, read in zip(records, reads, strict=True):
            verdict = judge(read, ledger=at.get(record.offset, ()), committed=committed, offset=record.offset,
                            steps=steps, receipts=receipts, stuck_after=judging.stuck_after, seen=seen)
            tally.add(verdict, topic=self.topic, partition=partition, offset=record.offset, order_no=read.order_no,
                      type_=read.type or read.skipped_type)
            if self.on_verdict is not None:
                self.on_verdict(partition, record.offset, verdict, read)
        for stray in ledger_strays(ledger, {r.offset for r in records}):
            tally.finding(End.LEDGER_WITHOUT_RECORD, f"ledger row {stray['id']} ({stray['reason']}) names this offset; "
                                                     "the range holds no record there",
                          topic=self.topic, partition=partition, offset=stray["src_offset"], order_no=stray["order_no"])


def _count(report: Report) -> None:
    metrics.RECONCILE_RUNS.labels(report.status).inc()
    metrics.RECONCILE_SECONDS.observe(report.seconds)
    for end, n in report.tally.ends.items():
        if n:
            metrics.RECONCILE_RECORDS.labels(end).inc(n)
    if report.error is None:
        show_latest(report.summary(), time.time(), report.until.timestamp())


def show_latest(summary: dict[str, int], finished: float, range_end: float) -> None:
    """The gauges of the latest completed run: set by the process that ran it, and by every worker's gauges'
    refresh from ``t_reconcile_run`` (so that they outlive the runner and agree across workers)."""
    for kind, n in summary.items():
        metrics.RECONCILE_FINDINGS.labels(kind).set(n)
    metrics.RECONCILE_LAST_RUN.set(finished)
    metrics.RECONCILE_LAST_RANGE_END.set(range_end)


def _utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)
