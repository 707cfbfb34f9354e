"""The offset a worker commits: through acknowledged offsets and offsets that hold no record
(transaction markers, aborted records), never past an offset handed out and not acknowledged.
A Hypothesis property over random partitions of records, markers and aborted transactions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.adapters.kafka.consumer import commit_offset, holes_between


def test_holes_between_positions_are_the_offsets_not_handed_out():
    assert holes_between(10, 15, [10, 11, 12, 13, 14]) == []
    assert holes_between(10, 16, [10, 11, 13]) == [(12, 13), (14, 16)]
    assert holes_between(0, 3, []) == [(0, 3)]
    assert holes_between(5, 9, [7]) == [(5, 7), (8, 9)]


def test_a_trailing_marker_is_committed_past():
    # records 0..2, the transaction's commit marker at 3: the end of the partition is 4
    assert commit_offset(None, [0, 1, 2], [(3, 4)]) == 4
    assert commit_offset(3, [], [(3, 4)]) == 4


def test_an_aborted_transaction_after_offset_0_does_not_stop_commits():
    # Faust misses this hole (its test is ``gap > 1 and r_offset``, and offset 0 is false).
    assert commit_offset(1, [5, 6], [(1, 5)]) == 7


def test_never_past_an_offset_handed_out_and_not_acknowledged():
    assert commit_offset(10, [11, 12], []) is None           # 10 is unacknowledged
    assert commit_offset(10, [10, 12], []) == 11              # faust-streaming#606 would commit 13
    assert commit_offset(10, [10, 13], [(11, 12)]) == 12


def test_nothing_new_is_no_commit():
    assert commit_offset(7, [], []) is None
    assert commit_offset(None, [], []) is None
    assert commit_offset(7, [], [(3, 7)]) is None


# -- the property ---------------------------------------------------------------------------

@st.composite
def partitions(draw):
    """A partition's log as kinds per offset (record / hole), the committed offset, and which
    records were acknowledged (a prefix in offset order, maybe with later ones too)."""
    kinds = draw(st.lists(st.sampled_from(["record", "record", "hole"]), min_size=1, max_size=60))
    committed = draw(st.integers(0, len(kinds)))
    seen = draw(st.integers(committed, len(kinds)))          # how far the fetcher has gone
    records = [o for o, kind in enumerate(kinds[:seen]) if kind == "record" and o >= committed]
    acked = sorted(draw(st.sets(st.sampled_from(records))) if records else set())
    holes = holes_between(committed, seen, records)
    return kinds, committed, acked, holes, seen


@given(partitions())
@settings(max_examples=500, deadline=None)
def test_the_commit_is_as_far_as_is_safe_and_no_further(case):
    kinds, committed, acked, holes, seen = case
    got = commit_offset(committed, acked, holes)
    acked_set = set(acked)
    # as far as acknowledged records and known holes reach, in order from the committed offset
    reach = committed
    while reach < seen and (reach in acked_set or kinds[reach] == "hole"):
        reach += 1
    assert got == (reach if reach > committed else None)
    # and so never past a record that was not acknowledged
    if got is not None:
        assert all(kinds[o] == "hole" or o in acked_set for o in range(committed, got))


def test_a_partition_never_committed_starts_where_its_records_began_not_at_the_first_acknowledged():
    # Records are acknowledged as they finish: a partition's first records may still be in flight
    # when later ones are done. Its first commit must not start at the first one acknowledged.
    from types import SimpleNamespace

    from faust.types import TP

    from app.adapters.kafka.consumer import HOLES, _new_offset

    tp = TP("first-commit", 0)
    consumer = SimpleNamespace(_acked={tp: [3, 4, 2]}, _acked_index={tp: {2, 3, 4}},
                               _committed_offset={tp: None}, _gap={})
    HOLES.started(tp, 0)                       # the first fetch was drained from offset 0
    try:
        assert _new_offset(consumer, tp) is None                    # 0 and 1 are in flight
        consumer._acked[tp] += [1, 0]
        assert _new_offset(consumer, tp) == 5
    finally:
        HOLES.forget([tp])


def test_records_acked_after_their_partition_was_revoked_commit_from_its_last_commit_or_not_at_all():
    # Faust forgets a revoked partition's committed offset before it waits for the records in flight;
    # those acked then must not be committed from the first one acked: the ones before it may be
    # records this worker never worked (dropped from its buffer by the rebalance).
    import asyncio
    from types import SimpleNamespace

    from faust.types import TP

    from app.adapters.kafka.consumer import HOLES, _forgetting_holes, _new_offset

    kept, fresh, unknown = TP("revoked", 0), TP("revoked", 1), TP("revoked", 2)
    consumer = SimpleNamespace(app=SimpleNamespace(should_stop=False),
                               _committed_offset={kept: 393, fresh: None, unknown: None},
                               _acked={}, _acked_index={}, _gap={})

    async def commit():
        return True

    async def faust_revoked(self, tps):       # what Consumer.on_partitions_revoked forgets
        for tp in tps:
            self._committed_offset.pop(tp, None)

    consumer.commit = commit
    HOLES.started(fresh, 380)                 # never committed here: its first fetch began at 380
    try:
        asyncio.run(_forgetting_holes(faust_revoked)(consumer, {kept, fresh, unknown}))
        consumer._acked = {tp: [402, 403] for tp in (kept, fresh, unknown)}
        consumer._acked_index = {tp: {402, 403} for tp in (kept, fresh, unknown)}
        consumer._committed_offset = {kept: None, fresh: None, unknown: None}
        assert _new_offset(consumer, kept) is None          # 393..401 were never acked
        assert _new_offset(consumer, fresh) is None         # nor 380..401
        assert _new_offset(consumer, unknown) is None       # nothing known to start from
        consumer._acked[kept] += list(range(393, 402))
        consumer._acked[fresh] += list(range(380, 402))
        assert _new_offset(consumer, kept) == 404
        assert _new_offset(consumer, fresh) == 404          # the records in flight at the revoke: committed
    finally:
        HOLES.forget([kept, fresh, unknown])


@given(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 12)), max_size=40), st.randoms())
@settings(max_examples=300, deadline=None)
def test_holes_learnt_in_any_order_are_all_kept(spans, rnd):
    # A partition revoked and assigned again, or a seek back, hands holes over out of order: each
    # must be kept (merged with the holes it touches), never folded into a later one and lost.
    from faust.types import TP

    from app.adapters.kafka.consumer import Holes

    holes = [(begin, begin + length) for begin, length in spans]
    rnd.shuffle(holes)
    tp = TP("any-order", 0)
    known = Holes()
    for hole in holes:
        known.add(tp, [hole])
    kept = known.of(tp)
    assert {o for b, e in kept for o in range(b, e)} == {o for b, e in holes for o in range(b, e)}
    assert all(e1 < b2 for (_, e1), (b2, _) in zip(kept, kept[1:]))     # sorted, apart, merged when touching


def test_an_earlier_hole_learnt_after_later_ones_still_lets_the_commit_pass_it():
    # The group consumer's own markers at 1003 and 1007 arrive after holes at 1200.. were known:
    # the commit from 1000 must pass every one of them, not stop at 1003 for good.
    from faust.types import TP

    from app.adapters.kafka.consumer import Holes

    tp = TP("late-holes", 0)
    known = Holes()
    known.add(tp, [(1200, 1201), (1300, 1301)])
    known.add(tp, [(1003, 1004), (1007, 1008)])
    acked = [o for o in range(1000, 1302) if o not in (1003, 1007, 1200, 1300)]
    assert commit_offset(1000, acked, known.of(tp)) == 1302


def test_only_the_watched_consumers_fetches_feed_the_commit_bookkeeping():
    # The reconcile's range reader is an aiokafka consumer of the same process reading the same
    # partitions further on: its fetches must not add holes or say where the group's records begin.
    from types import SimpleNamespace

    from faust.types import TP

    from app.adapters.kafka import consumer as bookkeeping

    tp = TP("watched", 0)

    class Fetched:
        """A fetch result of one consumer's assignment, drained from ``position`` up to ``moved_to``."""

        def __init__(self, position: int, moved_to: int, offsets: list[int]) -> None:
            state = SimpleNamespace(position=position, has_valid_position=True)
            self._assignment = SimpleNamespace(state_value=lambda _: state)
            self._topic_partition = tp
            self._drain = lambda: (setattr(state, "position", moved_to), [SimpleNamespace(offset=o) for o in offsets])

    class SubscriptionState:          # aiokafka's, as far as the watch reads it
        def __init__(self, assignment) -> None:
            self.subscription = SimpleNamespace(assignment=assignment)

    def getall(self, max_records=None):
        return self._drain()[1]

    reader, group = Fetched(1200, 1210, [1200, 1202]), Fetched(1000, 1010, [1000, 1001, 1002, 1004])
    group_consumer = SimpleNamespace(_subscription=SubscriptionState(group._assignment))
    watched_getall = bookkeeping._watching_holes(getall)
    try:
        bookkeeping.watch(group_consumer)
        watched_getall(reader)
        assert bookkeeping.HOLES.of(tp) == [] and bookkeeping.HOLES.first(tp) is None
        watched_getall(group)
        assert bookkeeping.HOLES.of(tp) == [(1003, 1004), (1005, 1010)]
        assert bookkeeping.HOLES.first(tp) == 1000
    finally:
        bookkeeping.HOLES.forget([tp])
