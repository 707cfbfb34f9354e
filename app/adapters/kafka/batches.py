"""Whole fetches handed to an agent as batches: Faust's per-record path, bypassed for one topic.

Faust 0.15.3 moves every record one by one from its fetcher to an agent's stream
(``Consumer._drain_messages``): a ``wait_first`` that makes four futures per record, the
conductor's ``on_message`` (a lock, flow control, the producer buffer's size, the schema
registry's decode into an ``Event``), the stream's queue, the stream iterator, the
``take_events`` buffer, and one ``ack`` per event. An agent that does nothing spends most of
its CPU per record there (row f of ``make bench``; the docs' Benchmarks page, "The layer in Faust's path");
ours hands whole batches to the pipeline anyway.

``Consumer._drain_messages`` is replaced (by ``app.adapters.kafka.upstream``) with
``app.adapters.kafka.drain._drain_messages``, which does the same for every topic except the ones
an agent asked to take in whole fetches (:class:`Feed`): their records, as Faust's own
``ConsumerMessage`` objects, go into the feed's buffer a fetch at a time, and the agent takes them
in batches of up to ``max_records`` (``app.adapters.kafka.acks.Batch``). An app with no feed runs
Faust's own loop, untouched (the benchmark's no-op agent, row f, is measured on it).

What is kept of Faust, so that its commits, rebalances and stop work as before:

* **Fetching, the group, offsets, commits**: Faust's consumer does them, unchanged
  (``_wait_next_records``, ``perform_seek`` when flow is stopped, read offsets and gaps
  as Faust keeps them, ``broker_commit_every``, the commit timer).
* **Tracking**: a record becomes *unacked* (``Consumer._unacked_messages``, what
  ``wait_empty`` waits for on rebalance and on stop) when the agent takes it, as a
  stream does when its iterator hands an event on; a record still in the buffer is like
  one in a stream's queue: never tracked, and dropped when Faust clears its queues
  (``flow_control.clear()``, and on ``resume()``: the feed is managed like a queue made
  with ``clear_on_resume=True``) or when its generation is no longer the consumer's.
  A dropped record is never acked, so nothing is committed past it, and the seek to the
  committed offsets after the rebalance fetches it again.
* **Acks** (``app.adapters.kafka.acks``): :meth:`Batch.ack_some` and :meth:`Batch.ack` ack records
  as ``Consumer.ack`` does, Faust's own bookkeeping of acked offsets, many at once (``ack_all``; then
  ``_new_offset``, corrected in ``app.adapters.kafka.consumer``, computes what may be
  committed). Nothing is acked implicitly: not when the agent asks for the next batch, not
  when it raises or is cancelled (``take_events`` acks in a ``finally``); asking for the
  next batch with the last one unacked is an error (with ``in_flight=1``). So a record is
  acked only after the agent's own work for it (its outcomes or its dead letter written)
  is done.
* **Records in flight** (``in_flight=n``, the worker's ``BATCHES_IN_FLIGHT``): at most ``n``
  batches' worth of records are taken and not acked; the next batch is handed out once a
  whole one fits under that bound. Records are acked one by one as they finish
  (:meth:`Batch.ack_some`), in any order, and a partition may have records in several
  batches at once: Faust's commit (``Consumer._new_offset``, corrected in
  ``app.adapters.kafka.consumer``) never passes the lowest record not acked, so never an
  unfinished one. (Faust's own ``concurrency > 1`` gives no such guarantee: its commit may
  step over one unacked offset, faust-streaming#606.) An order's records are kept in order
  by the batch handler's order gate, not here. Every taken record is tracked, so a
  rebalance and a stop wait for all the records in flight. The buffer holds two batches
  per batch in flight.
* **Back-pressure and flow control**: the fetcher waits while the buffer holds a full
  batch (like the conductor waits on a full stream queue), while Faust's flow control is
  suspended (the conductor's ``acquire``), and gives up the wait when the consumer stops
  its flow for a rebalance (``suspend_flow``, as Faust's loop does).

Left out for feed topics: Faust's per-message sensors (``on_message_in`` and the stream's
events; the worker's monitor ignores them anyway, ``app.observability.monitor``), the conductor's
decode (values are raw bytes here, read by our decoder), and the round-robin scheduler
between partitions inside one fetch (a batch holds the whole fetch; per partition the
records stay in offset order).

What an upstream fix would be: in Faust, a batch-mode channel (``Consumer.getmany``'s
records handed to one subscriber per fetch, with bulk ``track``/``ack`` on the consumer),
so ``take_events`` would not cost per record what it costs; and ``wait_first`` in the
drain loop only when the delivery cannot complete at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator

from faust.types import TP
from mode.utils.futures import notify

from app.adapters.kafka.acks import Batch

log = logging.getLogger(__name__)


def feeds_of(app) -> dict[str, Feed]:
    """The feeds registered on ``app``, by topic name."""
    feeds = app.__dict__.get("_order_feeds")
    if feeds is None:
        feeds = app.__dict__["_order_feeds"] = {}
    return feeds


class Feed:
    """The records of one topic, a fetch at a time, for the one agent that reads it.

    Register it before the worker starts (``Feed(app, topic_name, ...)``); in the agent,
    ``async for batch in feed.batches(stream)`` then ``batch.ack_some(...)`` as records finish
    and ``batch.ack()`` at the end.

    With ``in_flight=n`` the agent may have up to ``n`` batches' worth of records
    (``n * max_records``) taken and not acked: the next batch is handed out once a whole one
    fits under that bound, whatever partitions it holds. Records of one partition may be in
    several batches in flight and be acked out of order: Faust's commit goes no further than
    the lowest record not acked (``app.adapters.kafka.consumer.commit_offset``). Keeping an
    order's records in order across batches is the agent's (the batch handler's order gate)."""

    def __init__(self, app, topic: str, *, max_records: int, within: float) -> None:
        if max_records < 1 or within <= 0:
            raise ValueError("a feed needs max_records >= 1 and within > 0")
        feeds = feeds_of(app)
        if topic in feeds:
            raise ValueError(f"topic {topic} already has a feed")
        self.app, self.topic = app, topic
        self.max_records, self.within = max_records, within
        self.capacity = max_records            # buffered records before the fetcher waits
        self._parts: dict = {}                 # TP -> deque of records, partitions in order of arrival
        self._count = 0
        self._in_flight: list[Batch] = []
        self._unacked = 0                      # records handed out and not acked yet
        self._arrived = asyncio.Event()      # records were added, or a batch in flight was acked
        self._room = asyncio.Event()         # the buffer is below its capacity
        self._room.set()
        self._taking = False
        self.exempt = _none                    # records handed out, not acked, and not to count (held)
        self.dropped = 0                     # records dropped by a clear or a generation change
        # Partitions a person paused (app.pipeline.controls): none of their records is handed out. A
        # record of one that arrives is dropped (never tracked, so never acked: the commit stays before
        # it), its partition's fetching paused, and the first such offset kept for the seek at the resume.
        self.paused = _never
        self.unread: dict = {}                 # TP -> the first offset dropped for its pause
        feeds[topic] = self
        # Cleared like the streams' queues when Faust clears or resumes its flow.
        app.flow_control.manage_queue(self)

    @property
    def unacked(self) -> int:
        """Records handed out and not acked yet."""
        return self._unacked

    # -- the fetcher's side -------------------------------------------------------

    def has_room(self) -> bool:
        return self._count < self.capacity

    def offer(self, messages: list) -> None:
        """Add a fetch's records (the caller checked flow control and room)."""
        parts = self._parts
        tp, queue = None, None
        kept = 0
        for message in messages:
            if message.tp != tp:
                tp = message.tp
                if self.paused(tp):
                    self._hold_back(tp, message.offset)
                    queue = None
                    continue
                queue = parts.get(tp)
                if queue is None:
                    queue = parts[tp] = deque()
            if queue is not None:
                queue.append(message)
                kept += 1
        self._count += kept
        self._arrived.set()
        if self._count >= self.capacity:
            self._room.clear()

    async def put(self, messages: list) -> None:
        """Add a fetch's records, waiting for Faust's flow control and for room in the buffer."""
        flow = self.app.flow_control
        while True:
            if not flow.is_active():
                await flow.acquire()
                continue
            if not self.has_room():
                await self._room.wait()
                continue
            break
        generation = self.app.consumer_generation_id
        kept = [m for m in messages if m.generation_id == generation]
        self.dropped += len(messages) - len(kept)
        if kept:
            self.offer(kept)

    def clear(self) -> None:
        """Drop what no agent took yet (untracked, unacked: fetched again after the seek)."""
        if self._count:
            self.dropped += self._count
            log.debug("feed %s: %d records dropped by Faust's flow control", self.topic, self._count)
        self._parts.clear()
        self._count = 0
        self._arrived.clear()
        self._room.set()

    # -- the agent's side ---------------------------------------------------------

    async def batches(self, stream, *, in_flight: int = 1) -> AsyncIterator[Batch]:
        """Batches of up to ``max_records``: as soon as that many are there, else what came within
        ``within`` seconds (like ``take_events``). Each is acked by :meth:`Batch.ack`, never
        implicitly. With ``in_flight=1`` the last batch must be acked before the next is asked for;
        with more, the next is handed out once at most ``(in_flight - 1) * max_records`` records are
        unacked (acked one by one with :meth:`Batch.ack_some`, or with their batch)."""
        if in_flight < 1:
            raise ValueError("in_flight must be >= 1")
        if self._taking:
            raise RuntimeError(f"feed {self.topic} already has an agent taking from it")
        self._taking = True
        self.capacity = self.max_records * (2 * in_flight if in_flight > 1 else 1)
        bound = (in_flight - 1) * self.max_records      # unacked records the next batch may be added to
        if self._count < self.capacity:
            self._room.set()
        # Iterating the agent's channel subscribes its topic (what Stream.__aiter__ does);
        # no record will ever reach that channel's queue: the fetcher hands them here.
        aiter(stream.channel)
        consumer = self.app.consumer
        try:
            while True:
                if in_flight == 1 and self._in_flight:
                    raise RuntimeError("the previous batch was not acked: a batch is acked only by Batch.ack()")
                while self._unacked - self.exempt() > bound:
                    self._arrived.clear()
                    await self._arrived.wait()
                messages, partitions = await self._take()
                if not messages:               # all of an older generation: nothing to hand out
                    continue
                batch = Batch(messages, consumer, self, partitions)
                self._in_flight.append(batch)
                self._unacked += len(messages)
                yield batch
        finally:
            self._taking = False

    def give_up(self, tps) -> int:
        """Partitions ``tps`` were revoked and the rebalance cannot wait any longer for their records
        in flight: none of them will be acked (:meth:`Batch.give_up`). Returns how many there were."""
        given = sum(batch.give_up(tps) for batch in self._in_flight)
        if given:
            notify(getattr(self.app.consumer, "_waiting_for_ack", None))   # wait_empty looks again at once
        return given

    def _hold_back(self, tp, offset: int) -> None:
        """A record of ``tp`` (paused) at ``offset`` is not handed out: its fetching stops, and the
        resume seeks back to the first offset held back."""
        if tp not in self.unread or offset < self.unread[tp]:
            self.unread[tp] = offset
        self.app.consumer.pause_partitions([TP(tp.topic, tp.partition)])

    async def resume(self) -> list:
        """Partitions held back for a pause that has ended fetch again, from their first record held
        back; the partitions resumed."""
        ended = [tp for tp in self.unread if not self.paused(tp)]
        consumer = self.app.consumer
        for tp in ended:
            offset = self.unread.pop(tp)
            # Faust's own TP: its resume_partitions adds what it is given to its active partitions as it
            # is, and its next fetch asserts they are all TPs (an aiokafka TopicPartition is not).
            consumer.resume_partitions([TP(tp.topic, tp.partition)])
            if tp in consumer.assignment():
                await consumer.seek(tp, offset)
        if ended:
            self._arrived.set()
        return ended

    def forget(self, tps) -> None:
        """Partitions revoked: whoever gets them reads from their committed offset (never past what was
        held back), so what was held back here is forgotten."""
        for tp in tps:
            self.unread.pop(tp, None)

    def nudge(self) -> None:
        """What counts as in flight may have changed (more records held): look again."""
        self._arrived.set()

    def records_acked(self, n: int) -> None:
        """Records of a batch in flight were acked: room for the next batch, maybe."""
        self._unacked -= n
        self._arrived.set()

    def batch_acked(self, batch: Batch) -> None:
        """A batch was acked whole."""
        if batch in self._in_flight:
            self._in_flight.remove(batch)
            self._arrived.set()

    def _ready(self) -> int:
        """Records that may go into the next batch."""
        return self._count

    async def _take(self) -> tuple[list, frozenset]:
        if self._ready() < self.max_records:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.within
            while (ready := self._ready()) < self.max_records:
                if ready and not self.has_room():
                    break          # the buffer is full: no more can come
                left = deadline - loop.time()
                if left <= 0:
                    if ready:
                        break
                    deadline = loop.time() + self.within
                    left = self.within
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except TimeoutError:
                    pass
        return self._track(self.max_records)

    def _track(self, n: int) -> tuple[list, frozenset]:
        """Take up to ``n`` records of the consumer's current generation, whole partitions first in
        the order they arrived, and mark them unacked (what ``wait_empty`` waits for), in one step:
        no await between the two."""
        parts, generation = self._parts, self.app.consumer_generation_id
        unacked = self.app.consumer._unacked_messages
        taken: list = []
        partitions = set()
        for tp in list(parts):
            if len(taken) >= n:
                break
            queue = parts[tp]
            if self.paused(tp):                  # paused after its records came: held back too
                self._hold_back(tp, queue[0].offset)
                self._count -= len(queue)
                del parts[tp]
                continue
            while queue and len(taken) < n:
                message = queue.popleft()
                self._count -= 1
                if message.generation_id != generation:
                    self.dropped += 1
                    continue
                message.tracked = True
                unacked.add(message)
                taken.append(message)
                partitions.add(tp)
            if not queue:
                del parts[tp]
        if self._count < self.capacity:
            self._room.set()
        return taken, frozenset(partitions)


def _none() -> int:
    return 0


def _never(tp) -> bool:
    return False


__all__ = ["Feed", "feeds_of"]
