"""The feed that hands whole fetches to the order agent (app.adapters.kafka.batches): what it
tracks, when it acks, what it drops, and how it waits. Faust's consumer is a small stand-in here;
the real one runs in the integration and chaos suites (SIGTERM, rebalances, crash windows)."""

from __future__ import annotations

import asyncio
from weakref import WeakSet

import pytest
from faust.types import TP, ConsumerMessage
from mode.utils.queues import FlowControlEvent

from app.adapters.kafka.batches import Feed

TOPIC = "order-event"


class FakeConsumer:
    def __init__(self) -> None:
        self._unacked_messages = WeakSet()
        self.acked: list[int] = []

    def ack(self, message) -> bool:          # what Faust's Consumer.ack records
        message.acked = True
        self._unacked_messages.discard(message)
        self.acked.append(message.offset)
        return True


class FakeApp:
    def __init__(self) -> None:
        self.flow_control = FlowControlEvent(initially_suspended=False)
        self.consumer = FakeConsumer()
        self.consumer_generation_id = 1


class FakeStream:
    def __init__(self) -> None:
        self.channel = self

    def __aiter__(self):          # iterating the channel is what subscribes its topic in Faust
        self.subscribed = True
        return self

    async def __anext__(self):
        raise StopAsyncIteration


def messages(offsets, generation=1, partition=0):
    tp = TP(TOPIC, partition)
    return [ConsumerMessage(TOPIC, partition, o, 0.0, 0, [], b"k", b"v", None, 1, 1, tp, generation_id=generation)
            for o in offsets]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 5))


def test_a_full_batch_is_taken_at_once_and_tracked_until_acked():
    async def scenario():
        app = FakeApp()
        feed = Feed(app, TOPIC, max_records=3, within=0.05)
        feed.offer(messages(range(5)))
        stream = FakeStream()
        it = feed.batches(stream)
        batch = await it.__anext__()
        assert stream.subscribed
        assert [m.offset for m in batch.messages] == [0, 1, 2]
        # taken = in flight: what Faust's wait_empty waits for on rebalance and on stop
        assert {m.offset for m in app.consumer._unacked_messages} == {0, 1, 2}
        assert app.consumer.acked == []
        batch.ack()
        assert app.consumer.acked == [0, 1, 2] and not app.consumer._unacked_messages
        batch = await it.__anext__()             # the rest, once `within` has passed
        assert [m.offset for m in batch.messages] == [3, 4]
    run(scenario())


def test_nothing_is_acked_implicitly_and_the_next_batch_needs_the_last_one_acked():
    async def scenario():
        app = FakeApp()
        feed = Feed(app, TOPIC, max_records=2, within=0.05)
        feed.offer(messages(range(4)))
        it = feed.batches(FakeStream())
        await it.__anext__()
        with pytest.raises(RuntimeError, match="not acked"):
            await it.__anext__()
        assert app.consumer.acked == []
    run(scenario())


def test_an_agent_cancelled_mid_batch_acks_nothing():
    async def scenario():
        app = FakeApp()
        feed = Feed(app, TOPIC, max_records=2, within=0.05)
        feed.offer(messages(range(2)))
        taken = asyncio.Event()

        async def agent():
            async for batch in feed.batches(FakeStream()):
                taken.set()
                await asyncio.sleep(10)           # the batch's work, cut short
                batch.ack()

        task = asyncio.create_task(agent())
        await taken.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert app.consumer.acked == []
        assert len(app.consumer._unacked_messages) == 2
    run(scenario())


def test_a_partial_batch_comes_after_within():
    async def scenario():
        app = FakeApp()
        feed = Feed(app, TOPIC, max_records=500, within=0.05)
        it = feed.batches(FakeStream())
        take = asyncio.create_task(it.__anext__())
        await asyncio.sleep(0.01)
        feed.offer(messages([7, 8]))
        batch = await take
        assert [m.offset for m in batch.messages] == [7, 8]
    run(scenario())


def test_records_faust_clears_are_dropped_untracked_and_the_batch_in_flight_stays_tracked():
    async def scenario():
        app = FakeApp()
        feed = Feed(app, TOPIC, max_records=2, within=0.05)
        feed.offer(messages(range(4)))
        it = feed.batches(FakeStream())
        batch = await it.__anext__()
        app.flow_control.suspend()
        app.flow_control.clear()                  # what Faust does when partitions are revoked
        assert feed.dropped == 2
        assert {m.offset for m in app.consumer._unacked_messages} == {0, 1}
        batch.ack()
        assert app.consumer.acked == [0, 1]
        app.flow_control.resume()
        feed.offer(messages([2, 3], generation=2))
        app.consumer_generation_id = 2
        batch = await it.__anext__()
        assert [m.offset for m in batch.messages] == [2, 3]
    run(scenario())


def test_records_of_an_older_generation_are_never_handed_out():
    async def scenario():
        app = FakeApp()
        feed = Feed(app, TOPIC, max_records=10, within=0.05)
        feed.offer(messages([0, 1], generation=1))
        app.consumer_generation_id = 2
        feed.offer(messages([0, 1], generation=2))
        batch = await feed.batches(FakeStream()).__anext__()
        assert [(m.offset, m.generation_id) for m in batch.messages] == [(0, 2), (1, 2)]
        assert feed.dropped == 2
        await feed.put(messages([5], generation=1))       # a fetch of the old generation
        assert feed.dropped == 3
    run(scenario())


def test_a_buffer_of_an_older_generation_only_hands_out_no_empty_batch():
    async def scenario():
        app = FakeApp()
        feed = Feed(app, TOPIC, max_records=10, within=0.02)
        feed.offer(messages([0, 1], generation=1))
        app.consumer_generation_id = 2
        it = feed.batches(FakeStream())
        take = asyncio.create_task(it.__anext__())
        await asyncio.sleep(0.1)                            # several `within`s: still nothing
        assert not take.done()
        feed.offer(messages([0], generation=2))
        batch = await asyncio.wait_for(take, 1)
        assert [(m.offset, m.generation_id) for m in batch.messages] == [(0, 2)]
    run(scenario())


def test_the_fetcher_waits_for_room_and_for_flow_control():
    async def scenario():
        app = FakeApp()
        feed = Feed(app, TOPIC, max_records=2, within=0.05)
        await feed.put(messages([0, 1]))
        assert not feed.has_room()
        put = asyncio.create_task(feed.put(messages([2, 3])))
        await asyncio.sleep(0.02)
        assert not put.done()                      # a full batch is waiting: the fetcher waits
        it = feed.batches(FakeStream())
        batch = await it.__anext__()
        await asyncio.wait_for(put, 1)
        batch.ack()
        batch = await it.__anext__()
        assert [m.offset for m in batch.messages] == [2, 3]
        batch.ack()
        app.flow_control.suspend()
        put = asyncio.create_task(feed.put(messages([4])))
        await asyncio.sleep(0.02)
        assert not put.done()                      # suspended: as the conductor's acquire()
        app.flow_control.resume()
        await asyncio.wait_for(put, 1)
        batch = await it.__anext__()
        assert [m.offset for m in batch.messages] == [4]
    run(scenario())


def test_one_feed_per_topic_and_one_agent_per_feed():
    async def scenario():
        app = FakeApp()
        feed = Feed(app, TOPIC, max_records=2, within=0.05)
        with pytest.raises(ValueError):
            Feed(app, TOPIC, max_records=2, within=0.05)
        feed.offer(messages([0]))
        first = feed.batches(FakeStream())
        await first.__anext__()
        with pytest.raises(RuntimeError, match="already has an agent"):
            await feed.batches(FakeStream()).__anext__()
    run(scenario())


def test_acking_a_batch_leaves_faust_consumer_as_its_own_ack_one_by_one_does():
    import faust

    from app.adapters.kafka.acks import Batch

    async def scenario():
        states = []
        for bulk in (False, True):
            app = faust.App(f"t-bulk-ack-{bulk}", broker="kafka://127.0.0.1:1", store="memory://")
            consumer = app.consumer                      # built, never started: no broker needed
            app.topics._acking_topics.add(TOPIC)
            consumer._committed_offset[TP(TOPIC, 0)] = 3          # offsets 0..2 committed already
            batch = messages([1, 3, 4, 4, 5]) + messages([7, 8], partition=1) + [
                ConsumerMessage("other", 0, 9, 0.0, 0, [], b"k", b"v", None, 1, 1, TP("other", 0))]
            for message in batch:
                consumer._unacked_messages.add(message)
            batch[2].acked = True                                  # acked before, by someone else
            if bulk:
                Batch(batch, consumer).ack()
            else:
                for message in batch:
                    consumer.ack(message)
            states.append(({tp: sorted(v) for tp, v in consumer._acked.items()},
                           {tp: sorted(v) for tp, v in consumer._acked_index.items()},
                           consumer._n_acked, sorted((m.topic, m.partition, m.offset) for m in consumer._unacked_messages),
                           [m.acked for m in batch]))
        assert states[0] == states[1]
        acked, _, n, left, _ = states[1]
        assert acked == {TP(TOPIC, 0): [3, 4, 5], TP(TOPIC, 1): [7, 8]} and n == 5
        # below the committed offset, acked before by someone else, or of a topic without acks: not recorded
        assert left == [("order-event", 0, 1), ("order-event", 0, 4), ("other", 0, 9)]
    run(scenario())


def test_records_in_flight_are_bounded_and_acked_one_by_one_in_any_order():
    async def scenario():
        app = FakeApp()
        feed = Feed(app, TOPIC, max_records=3, within=0.05)
        it = feed.batches(FakeStream(), in_flight=2)
        feed.offer(messages(range(5), partition=0) + messages(range(2), partition=1))
        first = await it.__anext__()
        assert [(m.partition, m.offset) for m in first.messages] == [(0, 0), (0, 1), (0, 2)]
        second = await it.__anext__()        # a partition may be in two batches at once
        assert [(m.partition, m.offset) for m in second.messages] == [(0, 3), (0, 4), (1, 0)]
        third = asyncio.create_task(it.__anext__())
        await asyncio.sleep(0.1)
        assert not third.done()              # 6 unacked: a third batch of 3 would pass 2 x 3
        first.ack_some([2])
        await asyncio.sleep(0.1)
        assert not third.done()              # 5 unacked
        second.ack_some([0, 2])              # 3 unacked: room for a batch of 3
        third = await asyncio.wait_for(third, 1)
        assert [(m.partition, m.offset) for m in third.messages] == [(1, 1)]
        assert app.consumer.acked == [2, 3, 0]
        assert {(m.partition, m.offset) for m in app.consumer._unacked_messages} == {(0, 0), (0, 1), (0, 4), (1, 1)}
        first.ack()                           # the rest of the batch, once
        first.ack()
        first.ack_some([0])
        assert app.consumer.acked == [2, 3, 0, 0, 1]
    run(scenario())


def test_records_of_revoked_partitions_given_up_are_never_acked_and_count_in_flight_until_their_work_ends():
    async def scenario():
        app = FakeApp()
        feed = Feed(app, TOPIC, max_records=3, within=0.05)
        it = feed.batches(FakeStream(), in_flight=2)
        feed.offer(messages(range(3), partition=0) + messages(range(3), partition=1))
        first = await it.__anext__()
        second = await it.__anext__()
        first.ack_some([0])
        revoked = {TP(TOPIC, 0)}
        assert feed.give_up(revoked) == 2                      # offsets 1 and 2 of partition 0
        # wait_empty no longer waits for them; the other partition's records are still waited for
        assert {(m.partition, m.offset) for m in app.consumer._unacked_messages} == {(1, 0), (1, 1), (1, 2)}
        assert feed.unacked == 5                              # their work still runs: still in flight
        first.ack_some([1])                                   # its work ended: not acked, no longer in flight
        assert app.consumer.acked == [0] and feed.unacked == 4
        first.ack()                                           # the batch's end: the last given-up one too
        first.ack_some([2])
        assert app.consumer.acked == [0] and feed.unacked == 3
        assert feed.give_up(revoked) == 0
        second.ack()
        assert app.consumer.acked == [0, 0, 1, 2] and feed.unacked == 0
    run(scenario())


def test_a_partitions_later_records_are_handed_out_while_its_earlier_ones_are_in_flight():
    async def scenario():
        app = FakeApp()
        feed = Feed(app, TOPIC, max_records=10, within=0.02)
        it = feed.batches(FakeStream(), in_flight=2)
        feed.offer(messages([0, 1], partition=0))
        first = await it.__anext__()
        feed.offer(messages([2], partition=0))
        second = await asyncio.wait_for(it.__anext__(), 1)
        assert [m.offset for m in second.messages] == [2]
        second.ack()
        assert app.consumer.acked == [2] and not first.acked
    run(scenario())


def test_the_buffer_holds_two_batches_per_batch_in_flight_before_the_fetcher_waits():
    async def scenario():
        app = FakeApp()
        feed = Feed(app, TOPIC, max_records=2, within=0.05)
        it = feed.batches(FakeStream(), in_flight=2)
        take = asyncio.create_task(it.__anext__())
        await feed.put(messages([0, 1], partition=0))
        await take
        await feed.put(messages([2, 3], partition=0))     # partition 0 is busy: they wait, buffered
        await feed.put(messages([0, 1, 2, 3], partition=1))
        await feed.put(messages([0, 1], partition=2))        # 8: two batches for each of the two in flight
        assert not feed.has_room()
        put = asyncio.create_task(feed.put(messages([4], partition=1)))
        await asyncio.sleep(0.02)
        assert not put.done()
        await it.__anext__()                               # partition 1's first two
        await asyncio.wait_for(put, 1)
    run(scenario())


def test_a_full_buffer_hands_out_a_batch_at_once_once_records_in_flight_leave_room():
    async def scenario():
        app = FakeApp()
        feed = Feed(app, TOPIC, max_records=2, within=30)
        it = feed.batches(FakeStream(), in_flight=2)
        feed.offer(messages(range(7), partition=0) + messages([0], partition=1))
        assert not feed.has_room()
        first = await it.__anext__()
        second = await asyncio.wait_for(it.__anext__(), 1)      # a full batch is there: not after `within`
        assert [m.offset for m in first.messages + second.messages] == [0, 1, 2, 3]
        third = asyncio.create_task(it.__anext__())
        await asyncio.sleep(0.05)
        assert not third.done()                    # 4 unacked, a bound of 2 x 2
        second.ack_some([0])
        await asyncio.sleep(0.05)
        assert not third.done()
        first.ack()
        third = await asyncio.wait_for(third, 1)   # at once, not after `within` (30 s)
        assert [(m.partition, m.offset) for m in third.messages] == [(0, 4), (0, 5)]
    run(scenario())
