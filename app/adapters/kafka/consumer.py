"""The worker's Kafka consumer as Faust 0.15.3 builds it, with two corrections.

**The isolation level.** Faust's worker consumer reads ``read_uncommitted`` unless
Faust's own exactly-once mode is on (``AIOKafkaConsumerThread._create_worker_consumer``):
records of transactions an upstream producer aborted, or has not committed yet, reach
the agents and are acted on. :func:`_with_isolation` sets the consumer's isolation level to
``KAFKA_ISOLATION_LEVEL`` (``read_committed`` by default, :func:`configure`) before it starts; aiokafka's
fetcher then drops aborted batches and stops at the last stable offset.

**Commits past offsets that hold no record.** A transaction's commit or abort marker
takes an offset, and the records of an aborted transaction are never delivered.
Faust commits "the last acknowledged offset + 1" and learns of such holes only when a
later record arrives (``Consumer._drain_messages`` adds a "gap"); so:

* a partition whose last entry is a marker stays committed one short of its end for
  as long as nothing follows: a lag of 1 that never goes away;
* a hole of two or more offsets right after offset 0 (an aborted transaction after
  the first record) is never recorded (the test is ``gap > 1 and r_offset``, and 0 is
  false), and from then on ``Consumer._new_offset`` refuses to commit at all until
  the next rebalance;
* ``_new_offset`` also lets a commit step over one offset that was never acknowledged
  (``min(acked) - committed > 1``), faust-streaming#606.

So the fetch itself is watched: aiokafka drains a fetched partition only from where its
position stands, and moves the position past what it handed out and past what it
skipped (``FetchResult.getall``); every offset between the position before and the
position after that was not handed out is a hole (a marker, an aborted record, a
compacted one), known exactly and at once. :func:`commit_offset` then commits through
acknowledged offsets and holes only, in order from the committed offset: never past an
offset that was handed out and not acknowledged, and all the way past trailing markers.
Only the worker's group consumer is watched (:func:`watch`): the process has other aiokafka
consumers (the reconcile's range reader reads ``order-event`` over the trailing hour, ahead of
a group that is behind), and their holes, learnt at other positions and in another order,
would say nothing of where the group may commit. Holes may still arrive out of order (a
partition revoked and assigned again, a seek), so :meth:`Holes.add` merges in any order.

**The first commit of a partition.** Faust's ``_new_offset`` (like :func:`commit_offset` given
``None``) starts a partition that has no committed offset at the first offset acknowledged. That
is right only while records are acknowledged in offset order; ours are acknowledged as they
finish, so the first records may still be in flight when later ones are acknowledged. The
commit starts instead where the records handed out begin: the position the first fetch was
drained from (:meth:`Holes.first`). And when a partition is revoked, Faust forgets its committed
offset before it waits for the records in flight: what is acked then is committed from the
last commit before the revoke (:func:`_forgetting_holes` keeps it), or not at all.

**Acknowledged offsets forgotten on a rebalance.** ``Consumer.on_partitions_revoked`` drops
the acknowledged offsets of the revoked partitions before the app commits; they are
committed first here (:func:`_forgetting_holes`).

What the upstream fixes would be: a ``consumer_isolation_level`` setting in Faust; in
Faust's consumer, commit offsets computed from the fetch position (as Kafka's Java
consumer commits ``position()``), not from acknowledged offsets plus guessed gaps; and a
commit before the revoked partitions' bookkeeping is dropped.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import weakref
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence

from app.adapters.kafka import upstream
from app.adapters.kafka.batches import feeds_of

log = logging.getLogger(__name__)

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
Hole = tuple[int, int]          # [begin, end): offsets that hold no record to deliver


def holes_between(before: int, after: int, offsets: Sequence[int]) -> list[Hole]:
    """The offsets in ``[before, after)`` that are not in ``offsets`` (increasing), as ranges."""
    if after - before == len(offsets):
        return []
    holes: list[Hole] = []
    expected = before
    for offset in offsets:
        if offset > expected:
            holes.append((expected, offset))
        expected = offset + 1
    if after > expected:
        holes.append((expected, after))
    return holes


def commit_offset(committed: int | None, acked: Sequence[int], holes: Sequence[Hole]) -> int | None:
    """The offset to commit: from ``committed`` (None: nothing committed yet, start at the first
    offset known), through acknowledged offsets (sorted) and holes (sorted, not overlapping), up
    to the first offset that is neither. None when that is no further than ``committed``."""
    if committed is None:
        starts = ([acked[0]] if acked else []) + ([holes[0][0]] if holes else [])
        if not starts:
            return None
        position = min(starts)
    else:
        position = committed
    start = position
    a = bisect_left(acked, position)
    h = 0
    while True:
        if a < len(acked) and acked[a] == position:
            # a run of consecutive acknowledged offsets at once
            run = a
            while run + 1 < len(acked) and acked[run + 1] == acked[run] + 1:
                run += 1
            position = acked[run] + 1
            a = bisect_left(acked, position, run + 1)
            continue
        while h < len(holes) and holes[h][1] <= position:
            h += 1
        if h < len(holes) and holes[h][0] <= position:
            position = holes[h][1]
            a = bisect_left(acked, position, a)
            continue
        break
    if position <= start or (committed is not None and position <= committed):
        return None
    return position


class Holes:
    """The holes the fetcher skipped, per partition; written by the consumer's thread,
    read when Faust commits (the worker's event loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_tp: dict[tuple[str, int], list[Hole]] = {}
        self._first: dict[tuple[str, int], int] = {}     # the position of the first fetch drained

    def started(self, tp, position: int) -> None:
        """A fetch of ``tp`` is drained from ``position``: the first one is where its records begin."""
        key = (tp.topic, tp.partition)
        if key not in self._first:
            with self._lock:
                self._first.setdefault(key, position)

    def restart(self, tp, position: int) -> None:
        """What follows ``position`` is all that may be committed for ``tp`` from now on (its last commit
        before it was revoked: what this worker finishes of it later counts from there)."""
        with self._lock:
            self._first[(tp.topic, tp.partition)] = position

    def first(self, tp) -> int | None:
        """Where the records handed out for ``tp`` begin (since it was last forgotten), if known."""
        with self._lock:
            return self._first.get((tp.topic, tp.partition))

    def add(self, tp, holes: Iterable[Hole]) -> None:
        """Record ``holes`` of ``tp``, in any order: the known ones stay sorted and disjoint, and a
        hole that touches or overlaps others is merged with them (never dropped into a later one)."""
        key = (tp.topic, tp.partition)
        with self._lock:
            known = self._by_tp.setdefault(key, [])
            for hole in holes:
                _merge(known, hole)

    def of(self, tp) -> list[Hole]:
        with self._lock:
            return list(self._by_tp.get((tp.topic, tp.partition), ()))

    def drop_below(self, tp, offset: int) -> None:
        key = (tp.topic, tp.partition)
        with self._lock:
            known = self._by_tp.get(key)
            if known:
                kept = [(max(b, offset), e) for b, e in known if e > offset]
                self._by_tp[key] = kept

    def forget(self, tps: Iterable) -> None:
        with self._lock:
            for tp in tps:
                self._by_tp.pop((tp.topic, tp.partition), None)
                self._first.pop((tp.topic, tp.partition), None)


def _merge(known: list[Hole], hole: Hole) -> None:
    """Insert ``hole`` into ``known`` (sorted, disjoint, not touching), merged with its neighbours."""
    begin, end = hole
    if begin >= end:
        return
    if not known or known[-1][1] < begin:          # the usual case: after every known hole
        known.append(hole)
        return
    # The first known hole that ends at or after ``begin``, and the first that begins after ``end``:
    # every hole between them touches or overlaps ``hole``.
    first = bisect_left(known, begin, key=lambda h: h[1])
    last = bisect_right(known, end, lo=first, key=lambda h: h[0])
    if first < last:
        begin, end = min(begin, known[first][0]), max(end, known[last - 1][1])
    known[first:last] = [(begin, end)]


# The holes of the worker's group consumer: the only consumer whose fetches feed the commit
# bookkeeping. Other aiokafka consumers of the process (the reconcile's range reader, the
# watermark's, the admin's) read the same topics at other positions, and must neither add holes
# nor say where a partition's records begin (see :func:`watch`).
HOLES = Holes()
_watched: weakref.WeakSet = weakref.WeakSet()     # the group consumers' subscription states


def watch(consumer) -> None:
    """The fetches of ``consumer`` (an ``AIOKafkaConsumer``: the worker's group consumer, as Faust
    makes it) feed :data:`HOLES`; no other consumer's do."""
    _watched.add(consumer._subscription)


def _watched_fetch(assignment) -> bool:
    """Whether a fetch result of ``assignment`` came from a watched consumer: a watched consumer's
    subscription holds that very assignment (a consumer's fetch results carry its assignment)."""
    for state in _watched:
        subscription = state.subscription
        if subscription is not None and subscription.assignment is assignment:
            return True
    return False
_isolation_level = "read_committed"
_revoke_grace: float | None = None


def configure(isolation_level: str, revoke_grace: float | None = None) -> None:
    """The isolation level of every Faust worker consumer of this process (``settings.kafka.isolation_level``),
    and how long a revoke waits for the revoked partitions' records in flight (``settings.kafka.revoke_grace_seconds``;
    None: as long as they take, Faust's own wait).

    The corrections themselves are put in place by ``app.adapters.kafka.upstream``: this module only
    holds them (:func:`_with_isolation`, :func:`_watching_holes`, :func:`_new_offset`,
    :func:`_forgetting_holes`)."""
    global _isolation_level
    global _revoke_grace
    if isolation_level not in ISOLATION_LEVELS:
        raise ValueError(f"KAFKA_ISOLATION_LEVEL must be one of {', '.join(ISOLATION_LEVELS)}, "
                         f"not {isolation_level!r}")
    _isolation_level = isolation_level
    _revoke_grace = revoke_grace


def _with_isolation(create):
    @functools.wraps(create)
    def create_worker_consumer(self, transport):
        made = create(self, transport)
        # Read by aiokafka when the consumer starts and builds its fetcher (just after this).
        upstream.replace_on_instance(made, "_isolation_level", _isolation_level)
        watch(made)
        return made
    return create_worker_consumer


def _watching_holes(getall):
    @functools.wraps(getall)
    def watched_getall(self, max_records=None):
        if not _watched_fetch(self._assignment):
            # Another consumer of the process (the reconcile's range reader): its positions are not
            # the group's, and what it skipped says nothing of where the group may commit.
            return getall(self, max_records)
        # aiokafka drains a fetch only from where the partition's position stands (check_assignment);
        # draining moves the position past what it returned and past what it skipped.
        state = self._assignment.state_value(self._topic_partition)
        before = state.position if state is not None and state.has_valid_position else None
        records = getall(self, max_records)
        if before is not None and (records or (state.has_valid_position and state.position > before)):
            HOLES.started(self._topic_partition, before)
        if before is not None and state.has_valid_position and state.position > before:
            holes = holes_between(before, state.position, [record.offset for record in records])
            if holes:
                HOLES.add(self._topic_partition, holes)
        return records
    return watched_getall


def _new_offset(self, tp):
    """Faust's ``Consumer._new_offset``, computed from acknowledged offsets and known holes."""
    acked = self._acked[tp]
    holes = HOLES.of(tp)
    if not acked and not holes:
        return None
    acked.sort()
    committed = self._committed_offset[tp]
    if committed is None:
        # Nothing committed yet, or the partition was revoked (Faust forgets its committed offset
        # then, and records still in flight are acked after): the commit starts where the records
        # handed out begin, or at the last commit before the revoke, never at the first offset
        # acked (records are acked out of order: earlier ones may never have been worked). Neither
        # known: no commit.
        committed = HOLES.first(tp)
        if committed is None:
            return None
    offset = commit_offset(committed, acked, holes)
    if offset is None:
        return None
    done = bisect_left(acked, offset)
    if done:
        self._acked_index[tp].difference_update(acked[:done])
        del acked[:done]
    HOLES.drop_below(tp, offset)
    gaps = self._gap.get(tp)
    if gaps:                       # Faust's own gap guesses, no longer read: keep them from growing
        gaps.chop(0, offset)
    return offset


def _forgetting_holes(revoked):
    @functools.wraps(revoked)
    async def on_partitions_revoked(self, tps):
        # Faust's Consumer.on_partitions_revoked forgets the acknowledged offsets of the revoked
        # partitions (it pops ``_acked``) *before* the app waits for the streams and commits: what
        # was acknowledged since the last commit tick (up to BROKER_COMMIT_INTERVAL_SECONDS of
        # work) was never committed and ran again after every rebalance. Commit it first, as
        # Kafka's own consumers commit before they rejoin; the batch still in flight is
        # acknowledged and committed later, when Faust waits for it (``wait_empty``).
        if not self.app.should_stop:
            try:
                # A commit already under way is waited for, and this one then commits nothing:
                # ask again for what was acked meanwhile (nothing to commit costs nothing).
                if not await self.commit():
                    await self.commit()
            except Exception as exc:
                log.warning("commit before the partitions were revoked failed: %r", exc)
        # Faust forgets the revoked partitions' committed offsets; records of theirs still in flight
        # are acked later (wait_empty) and committed from what was committed last, or not at all.
        # (Nothing committed yet in this process: where its records began, as for a first commit.)
        for feed in feeds_of(self.app).values():        # what a pause held back: read again from the commit
            feed.forget(tps)
        last = {tp: self._committed_offset.get(tp) for tp in tps}
        last = {tp: offset if offset is not None else HOLES.first(tp) for tp, offset in last.items()}
        HOLES.forget(tps)
        for tp, offset in last.items():
            if offset is not None:
                HOLES.restart(tp, offset)
        # Faust then waits for every record in flight (wait_empty), however long they take: the whole
        # group waits with it. Past the grace, the revoked partitions' records are given up instead:
        # never acked, so never committed; their work goes on, its writes fenced like any late
        # finisher's, and whoever owns the partitions next reads them again.
        timer = None
        if _revoke_grace is not None and not self.app.should_stop:
            timer = asyncio.get_running_loop().call_later(_revoke_grace, _give_up, self.app, frozenset(tps))
        try:
            return await revoked(self, tps)
        finally:
            if timer is not None:
                timer.cancel()
    return on_partitions_revoked


def _give_up(app, tps: frozenset) -> None:
    given = sum(feed.give_up(tps) for feed in feeds_of(app).values())
    if given:
        log.warning("rebalance: %d records of the revoked partitions still in flight after KAFKA_REVOKE_GRACE_SECONDS="
                    "%g s are given up: they are not committed, and whoever gets their partitions reads them again "
                    "(their work goes on here, fenced on its claims)", given, _revoke_grace)
