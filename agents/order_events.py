"""The ``order-event`` agent: hand each batch to the batch handler, record what happened.

With ``FETCH_BATCHES`` (the default) the agent takes whole fetches from Faust's consumer
(``app.adapters.kafka.batches``): a record is acked only when the batch handler says it is
finished (its outcomes committed, or its dead letter written), never implicitly, and the batch
is acked whole when the handler returns. Up to ``BATCHES_IN_FLIGHT`` batches' worth of records
are in flight, each batch in a task of its own: a partition may have records in several of
them, Faust's commit never passes the lowest record not acked, and the batch handler keeps an
order's records in order (an order's records in a later batch wait for that order in the
earlier one, whatever partitions they came from; other orders do not wait). Without
``FETCH_BATCHES`` it reads Faust's stream with ``take_events()``, one batch at a time, and the
facts below hold as they are.

Faust facts this agent is built around (faust-streaming 0.15.3):

* ``Stream.take_events()`` (like ``take()``) acks every event of the batch in
  a ``finally`` around its ``yield`` (faust/streams.py, ``take_events``): when
  the loop asks for the next batch, and also when the body raises or the agent
  is cancelled and the generator is closed. An exception escaping this body
  would therefore ack, then commit, a batch that was never finished.
  So the body never raises for a record (the batch handler routes failures to
  the dead-letter topic), and if anything else escapes, the process stops with
  ``os._exit`` before the generator can ack (``app.exits``): Kafka delivers the
  batch again.
* With ``concurrency > 1`` actors share one queue and ack out of order, and the
  commit can jump over an unacked offset (faust-streaming#606, the ``> 1`` test
  in ``Consumer._new_offset``). Concurrency stays 1; we scale by partitions and
  workers, and parallelise inside a batch.
* On SIGTERM and on rebalance, Faust waits for every delivered event to be
  acked (``stream_wait_empty``) before its final commit, so the batch in
  flight finishes and is committed.
* Values are read raw: a record that is not JSON must reach our decoder; a
  Faust decode error inside ``take()`` silently ends the agent.
"""

from __future__ import annotations

import asyncio
import logging
import time

import faust

from app.adapters.kafka import batches as kafka_batches
from app.adapters.kafka.records import source_record
from app.adapters.mysql import MySqlStore
from app.exits import stop_without_ack
from app.faust_app import freeze_startup_objects
from app.injection import Wire
from app.observability import metrics
from app.pipeline.batch import BatchHandler, BatchReport
from app.pipeline.controls import Controls
from app.pipeline.reasons import label_of
from app.settings import Settings

log = logging.getLogger(__name__)


async def process_order_events(stream, *, settings: Settings, feed: kafka_batches.Feed | None,
                               batches: BatchHandler, store: MySqlStore, owner: str, controls: Controls,
                               effect_names: tuple[str, ...]) -> None:
    metrics.HELD_RECORDS.set_function(lambda: batches.held)
    for effect in effect_names:
        metrics.HELD_BY_EFFECT.labels(effect).set_function(lambda effect=effect: batches.holds.by_effect[effect])
    if feed is not None:
        # Records held while their provider is down, or while a person holds their effect, do not count
        # against the records in flight, up to the hold's bound: past it, a person's hold holds them all
        # the same and the worker takes no new batch (its partitions wait in the broker).
        bound = settings.effects.breaker_hold_records
        feed.exempt = lambda: min(batches.held, bound)
        batches.on_hold = feed.nudge
        # A partition a person paused hands out no record; resumed, it is read again from the first
        # record held back (app.pipeline.controls).
        feed.paused = lambda tp: controls.is_paused(tp.topic, tp.partition)
        controls.on_change.append(lambda _: asyncio.ensure_future(feed.resume()))
    freeze_startup_objects()
    in_flight = settings.batches.in_flight if feed else 1
    log.info("consuming %s as %s (event loop: %s; %s)", settings.kafka.topic, owner,
             type(asyncio.get_running_loop()).__module__,
             f"whole fetches, up to {in_flight} batches' worth of records in flight" if feed
             else "Faust's stream, record by record")
    trips = _RoundTrips(store)

    async def work(batch) -> None:
        try:
            started = time.perf_counter()
            metrics.IN_FLIGHT_BATCH.inc()
            # Each order's records are acked as soon as they are finished (their outcomes
            # committed, or their dead letters written); the batch is acked whole at the end.
            report = await batches.handle([source_record(message) for message in batch.messages],
                                          finished=batch.ack_some, still_ours=batch.still_ours)
            batch.ack()
            seconds = time.perf_counter() - started
            metrics.IN_FLIGHT_BATCH.dec()
            _record(report, len(batch), seconds, trips.since_last())
            if seconds > settings.batches.slow_seconds:
                log.warning("slow batch: %d records in %.0f ms (%s)", len(batch), seconds * 1000,
                            ", ".join(f"{phase} {s * 1000:.0f} ms" for phase, s in report.seconds.items()))
        except BaseException as exc:  # noqa: B036 -- see the module docstring
            stop_without_ack(exc)

    if in_flight == 1:
        async for batch in (feed.batches(stream) if feed else _stream_batches(stream, settings)):
            await work(batch)
        return
    # Several batches at once, each in a task; the feed hands out the next one once a whole
    # batch fits under `in_flight` batches' worth of unacked records.
    tasks: set[asyncio.Task] = set()
    try:
        async for batch in feed.batches(stream, in_flight=in_flight):
            task = asyncio.create_task(work(batch))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        for task in tasks:          # cut short (the agent cancelled mid-batch): they leave unacked
            task.cancel()


def register(app: faust.App, topic: faust.TopicT, settings: Settings, wire: Wire):
    """The ``order-event`` agent on ``app``, handing its batches to the runtime's batch handler (found as
    the agent starts: the gauge of held records reads it after the runtime closed too)."""
    feed = None
    if settings.batches.fetch:
        feed = kafka_batches.Feed(app, settings.kafka.topic, max_records=settings.batches.size,
                                  within=settings.batches.within_seconds)
        metrics.IN_FLIGHT_RECORDS.set_function(lambda: feed.unacked)
    agent = app.agent(topic, name="order_events", concurrency=1)
    return agent(wire.resolved(process_order_events, feed=feed))


class _StreamBatch:
    """A ``take_events()`` batch: Faust acks it when the loop asks for the next one."""

    __slots__ = ("messages",)

    def __init__(self, events) -> None:
        self.messages = [event.message for event in events]

    def __len__(self) -> int:
        return len(self.messages)

    def ack_some(self, indices) -> None:
        pass

    def still_ours(self, index: int) -> bool:
        return True

    def ack(self) -> None:
        pass


async def _stream_batches(stream, settings: Settings):
    async for events in stream.take_events(settings.batches.size, within=settings.batches.within_seconds):
        yield _StreamBatch(events)


class _RoundTrips:
    """The store's round trips since the last batch recorded them (batches in flight at once share
    one store: each records what was sent since the one before, so the total stays exact)."""

    def __init__(self, store) -> None:
        self.store = store
        self.last = store.round_trips

    def since_last(self) -> int:
        now = self.store.round_trips
        n, self.last = now - self.last, now
        return n


def _record(report: BatchReport, size: int, seconds: float, round_trips: int) -> None:
    metrics.BATCHES.inc()
    metrics.BATCH_SECONDS.observe(seconds)
    metrics.BATCH_EVENTS.observe(size)
    metrics.DB_ROUND_TRIPS.inc(round_trips)
    for outcome, count in report.outcomes.items():
        metrics.EVENTS.labels(outcome).inc(count)
    # Labels from a closed vocabulary (app.pipeline.reasons): a reason's detail the record chose
    # (unsupported_version:<v>) stays in the letter and the log line, never in a series.
    for letter in report.dead_letters:
        label = label_of(letter.reason)
        metrics.DEAD_LETTERS.labels(label).inc()
        if letter.order_no is None and letter.reason != "internal_error":   # failed to decode
            metrics.MALFORMED.labels(label).inc()
    for reason, count in report.covered.items():         # unreadable records another letter stands for
        metrics.MALFORMED.labels(label_of(reason)).inc(count)
    if report.skipped:
        metrics.SKIPPED_TYPES.record(report.skipped, report.skipped_at)
    for reason, count in report.retries.items():
        metrics.RETRIES.labels(label_of(reason)).inc(count)
    metrics.LEASE_WAITS.inc(report.lease_waits)
    metrics.INFRA_WAIT_SECONDS.inc(report.infra_wait_seconds)
