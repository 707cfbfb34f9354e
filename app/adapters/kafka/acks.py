"""Records an agent took from a feed (``app.adapters.kafka.batches``), and their acks.

A :class:`Batch` acks its records as Faust's ``Consumer.ack`` does, Faust's own bookkeeping of
acked offsets, many at once (:func:`ack_all`; then ``_new_offset``, corrected in
``app.adapters.kafka.consumer``, computes what may be committed). Nothing is acked implicitly: a
record is acked when the agent says its work is done (:meth:`Batch.ack_some` as records finish, in
any order; :meth:`Batch.ack` for the rest), and one whose partition was revoked is given up
(:meth:`Batch.give_up`): never acked, so never committed, and fetched again by the partition's next
owner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from faust.transport import consumer as faust_consumer
from faust.types.tuples import ack_lock
from mode.utils.futures import notify

_FAUST_ACK = faust_consumer.Consumer.ack


class Source(Protocol):
    """The feed a batch came from (``app.adapters.kafka.batches.Feed``), told as its records are acked."""

    def records_acked(self, n: int) -> None: ...

    def batch_acked(self, batch: Batch) -> None: ...


class Batch:
    """Records an agent took from a :class:`Feed`; :meth:`ack_some` as records finish, :meth:`ack`
    for the rest once the batch's work is done."""

    __slots__ = ("messages", "partitions", "_consumer", "_feed", "acked", "_left", "_given_up")

    def __init__(self, messages: list, consumer, feed: Source | None = None, partitions: frozenset = frozenset()) -> None:
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
            self._feed.batch_acked(self)

    def still_ours(self, index: int) -> bool:
        """Whether record ``index`` is still this worker's to work: not given up by a rebalance."""
        return not self._given_up or index not in self._given_up

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
            self._feed.records_acked(n)

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
            self._feed.records_acked(len(messages))


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


__all__ = ["Batch", "ack_all"]
