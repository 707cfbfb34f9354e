"""Whole fetches handed to an agent as batches: Faust's per-record path, bypassed for one topic.

Faust 0.15.3 moves every record one by one from its fetcher to an agent's stream
(``Consumer._drain_messages``): a ``wait_first`` that makes four futures per record, the
conductor's ``on_message`` (a lock, flow control, the producer buffer's size, the schema
registry's decode into an ``Event``), the stream's queue, the stream iterator, the
``take_events`` buffer, and one ``ack`` per event. An agent that does nothing spends most of
its CPU per record there (row f of ``make bench``; the docs' Benchmarks page, "The layer in Faust's path");
ours hands whole batches to the pipeline anyway.

``Consumer._drain_messages`` is replaced (by ``app.adapters.kafka.upstream``) with :func:`_drain_messages`, which
does the same for every topic except the ones an agent asked to take in whole fetches
(:class:`Feed`): their records, as Faust's own ``ConsumerMessage`` objects, go into the
feed's buffer a fetch at a time, and the agent takes them in batches of up to
``max_records``. An app with no feed runs Faust's own loop, untouched (the benchmark's
no-op agent, row f, is measured on it).

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
* **Acks**: :meth:`Batch.ack_some` and :meth:`Batch.ack` ack records as ``Consumer.ack`` does,
  Faust's own bookkeeping of acked offsets, many at once (:func:`ack_all`; then
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
from collections.abc import AsyncIterator, Sequence

from faust.transport import consumer as faust_consumer
from faust.types.tuples import ack_lock
from mode.utils.futures import notify

from app.adapters.kafka import upstream

log = logging.getLogger(__name__)

_FAUST_ACK = faust_consumer.Consumer.ack
_FAUST_DRAIN = "faust.transport.consumer.Consumer._drain_messages"     # its entry in upstream.REPLACEMENTS


def feeds_of(app) -> dict[str, Feed]:
    """The feeds registered on ``app``, by topic name."""
    feeds = app.__dict__.get("_order_feeds")
    if feeds is None:
        feeds = app.__dict__["_order_feeds"] = {}
    return feeds


class Batch:
    """Records an agent took from a :class:`Feed`; :meth:`ack_some` as records finish, :meth:`ack`
    for the rest once the batch's work is done."""

    __slots__ = ("messages", "partitions", "_consumer", "_feed", "acked", "_left", "_given_up")

    def __init__(self, messages: list, consumer, feed: Feed | None = None, partitions: frozenset = frozenset()) -> None:
        self.messages = messages
        self.partitions = partitions
        self._consumer = consumer
        self._feed = feed
        self.acked = False
        self._left = len(messages)              # records not acked yet
        self._given_up: set[int] | None = None   # indices of records given up and still being worked

    def __len__(self) -> int:
        return len(self.messages)

    def ack_some(self, indices: Sequence[int]) -> None:
        """Tell Faust's consumer these records (indices into :attr:`messages`) are done: their offsets
        may be committed once every record before them in their partition is done too. A record given
        up (:meth:`give_up`) is not acked: it only stops counting as in flight."""
        if self.acked:
            return
        given_up = self._given_up
        if given_up:
            ended = [i for i in indices if i in given_up]
            if ended:
                given_up.difference_update(ended)
                self._ended(len(ended))
        fresh = [message for message in (self.messages[i] for i in indices) if not message.acked]
        if fresh:
            self._ack(fresh)

    def ack(self) -> None:
        """Tell Faust's consumer every record of the batch is done (except those given up)."""
        if self.acked:
            return
        rest = [message for message in self.messages if not message.acked]
        if rest:
            self._ack(rest)
        if self._given_up:
            self._ended(len(self._given_up))
            self._given_up = None
        self.acked = True
        if self._feed is not None:
            self._feed._done(self)

    def give_up(self, tps) -> int:
        """The records of partitions ``tps`` not acked yet will never be acked by this batch: their
        partitions were revoked. They leave what Faust's ``wait_empty`` waits for at once, and count
        as in flight until their work ends (:meth:`ack_some` or :meth:`ack` for them). Their offsets
        are never recorded as acked, so never committed: whoever owns the partitions next reads
        them again. Returns how many."""
        if self.acked:
            return 0
        unacked = getattr(self._consumer, "_unacked_messages", None)
        given: list[int] = []
        for i, message in enumerate(self.messages):
            if not message.acked and message.tp in tps:
                message.acked = True                 # what keeps every later ack of it a no-op
                if unacked is not None:
                    unacked.discard(message)
                given.append(i)
        if given:
            if self._given_up is None:
                self._given_up = set()
            self._given_up.update(given)
        return len(given)

    def _ended(self, n: int) -> None:
        self._left -= n
        if self._feed is not None:
            self._feed._acked(n)

    def _ack(self, messages: list) -> None:
        consumer = self._consumer
        if getattr(type(consumer), "ack", None) is _FAUST_ACK:
            ack_all(consumer, messages)
        else:                                   # a consumer with an ack of its own: ask it, one by one
            for message in messages:
                consumer.ack(message)
                message.acked = True
        self._left -= len(messages)
        if self._feed is not None:
            self._feed._acked(len(messages))


def ack_all(consumer, messages: Sequence) -> int:
    """Faust's ``Consumer.ack`` (faust-streaming 0.15.3) for many records at once: the same
    bookkeeping (``_acked``, ``_acked_index``, ``_unacked_messages``, ``_n_acked``) under the same
    lock, each partition's state looked up once and ``wait_empty`` woken once, not per record.
    ``tests/unit/test_kafka_batches.py`` checks it leaves the consumer as ``Consumer.ack`` does.
    Returns how many offsets were recorded as acked."""
    acks_enabled_for = consumer.app.topics.acks_enabled_for
    committed_of, index_of, acked_of = consumer._committed_offset, consumer._acked_index, consumer._acked
    unacked = consumer._unacked_messages
    n, tp, enabled, committed, index, offsets = 0, None, False, None, None, None
    with ack_lock:
        try:
            for message in messages:
                if message.acked:
                    continue
                message.acked = True
                if message.tp != tp:
                    tp = message.tp
                    enabled = acks_enabled_for(message.topic)
                    index = offsets = None
                    if enabled:
                        committed = committed_of[tp]
                if not enabled:
                    continue
                offset = message.offset
                if committed is None or offset >= committed:
                    if index is None:
                        index, offsets = index_of[tp], acked_of[tp]
                    if offset not in index:
                        unacked.discard(message)
                        index.add(offset)
                        offsets.append(offset)
                        n += 1
        finally:
            consumer._n_acked += n
            notify(consumer._waiting_for_ack)
    return n


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
        for message in messages:
            if message.tp != tp:
                tp = message.tp
                queue = parts.get(tp)
                if queue is None:
                    queue = parts[tp] = deque()
            queue.append(message)
        self._count += len(messages)
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

    def nudge(self) -> None:
        """What counts as in flight may have changed (more records held): look again."""
        self._arrived.set()

    def _acked(self, n: int) -> None:
        """Records of a batch in flight were acked: room for the next batch, maybe."""
        self._unacked -= n
        self._arrived.set()

    def _done(self, batch: Batch) -> None:
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


# -- Faust's drain loop, with feeds ---------------------------------------------------

async def _drain_messages(self, fetcher) -> None:
    """``Consumer._drain_messages`` (faust-streaming 0.15.3) with feed topics' records handed over
    a fetch at a time; every other topic's records go through Faust's callback one by one, as in
    the original."""
    feeds = feeds_of(self.app)
    if not feeds:
        return await upstream.original(_FAUST_DRAIN)(self, fetcher)
    callback = self.callback
    consumer_should_stop = self._stopped.is_set
    fetcher_should_stop = fetcher._stopped.is_set
    get_read_offset = self._read_offset.__getitem__
    set_read_offset = self._read_offset.__setitem__
    set_flag, unset_flag = self.diag.set_flag, self.diag.unset_flag
    commit_every = self._commit_every
    acks_enabled_for = self.app.topics.acks_enabled_for
    to_message = self._to_message
    app = self.app
    monitor = app.monitor
    try:
        while not (consumer_should_stop() or fetcher_should_stop()):
            set_flag(faust_consumer.CONSUMER_FETCHING)
            records, active_partitions = await self._wait_next_records(1.0)
            await self.sleep(0)
            if self.should_stop:
                break
            if records is None:
                continue
            if not self.flow_active:
                # Faust's getmany: records fetched while the flow is stopped are not delivered.
                try:
                    await self.perform_seek()
                except Exception as exc:
                    self.log.warning(f"exception performing seek when flow not active {exc}")
                continue
            generation_id = app.consumer_generation_id
            fetched: dict = {}
            for tp, tp_records in records.items():
                if not self.flow_active or app.consumer_generation_id != generation_id:
                    break
                if not (active_partitions is None or tp in active_partitions or tp in self._buffered_partitions):
                    continue
                monitor.track_tp_end_offset(tp, self.highwater(tp))
                feed = feeds.get(tp.topic)
                r_offset = get_read_offset(tp)
                if feed is None:
                    if not await _deliver_one_by_one(self, tp, tp_records, r_offset, generation_id, callback,
                                                     commit_every, acks_enabled_for, to_message, set_read_offset):
                        break
                    continue
                messages = fetched.setdefault(feed, [])
                for record in tp_records:
                    offset = record.offset
                    if r_offset is not None and offset < r_offset:
                        continue                      # Faust's "DROPPED MESSAGE ROFF"
                    if r_offset and offset - r_offset > 1 and acks_enabled_for(tp.topic):
                        await self._add_gap(tp, r_offset + 1, offset)
                    messages.append(to_message(tp, record))
                    r_offset = offset
                if r_offset is not None:
                    set_read_offset(tp, r_offset)
            if commit_every is not None and self._n_acked >= commit_every:
                self._n_acked = 0
                await self.commit()
            for feed, messages in fetched.items():
                if not messages:
                    continue
                if app.flow_control.is_active() and feed.has_room():
                    feed.offer(messages)              # the usual case: no future, no task
                else:
                    await self.wait_first(feed.put(messages), self.suspend_flow.wait())
            unset_flag(faust_consumer.CONSUMER_FETCHING)
    except self.consumer_stopped_errors:
        if self.transport.app.should_stop:
            self.log.info("Broker stopped consumer, shutting down...")
            return
        raise
    except asyncio.CancelledError:
        if self.transport.app.should_stop:
            self.log.info("Consumer shutting down for user cancel.")
            return
        raise
    except Exception as exc:
        self.log.exception("Drain messages raised: %r", exc)
        raise
    finally:
        unset_flag(faust_consumer.CONSUMER_FETCHING)


async def _deliver_one_by_one(self, tp, tp_records: Sequence, r_offset, generation_id, callback, commit_every,
                              acks_enabled_for, to_message, set_read_offset) -> bool:
    """Faust's own per-record delivery (its getmany's checks and its drain loop's body), for a topic
    without a feed; False when the flow stopped or the generation changed (the fetch is abandoned)."""
    app = self.app
    for n, record in enumerate(tp_records, start=1):
        if not self.flow_active or app.consumer_generation_id != generation_id:
            return False
        if n % 100 == 0:
            await asyncio.sleep(0)
        message = to_message(tp, record)
        offset = message.offset
        if r_offset is None or offset >= r_offset:
            gap = offset - (r_offset or 0)
            if gap > 1 and r_offset and acks_enabled_for(message.topic):
                await self._add_gap(tp, r_offset + 1, offset)
            if commit_every is not None and self._n_acked >= commit_every:
                self._n_acked = 0
                await self.commit()
            await self.wait_first(callback(message), self.suspend_flow.wait())
            set_read_offset(tp, offset)
            r_offset = offset
    return True


__all__ = ["Batch", "Feed", "ack_all", "feeds_of"]
