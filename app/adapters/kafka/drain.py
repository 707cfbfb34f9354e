"""Faust's drain loop, with feeds: ``Consumer._drain_messages`` (faust-streaming 0.15.3), replaced by
``app.adapters.kafka.upstream`` with :func:`_drain_messages`.

It does what Faust's does for every topic except those an agent asked to take in whole fetches
(``app.adapters.kafka.batches.Feed``): their records, as Faust's own ``ConsumerMessage`` objects,
go into the feed's buffer a fetch at a time. Fetching, the group, offsets and commits stay Faust's
(``_wait_next_records``, ``perform_seek`` when flow is stopped, read offsets and gaps as Faust keeps
them, ``broker_commit_every``); the fetcher waits while the feed's buffer is full or Faust's flow
control is suspended, and gives the wait up when the consumer stops its flow for a rebalance
(``suspend_flow``). An app with no feed runs Faust's own loop, untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from faust.transport import consumer as faust_consumer

from app.adapters.kafka import upstream
from app.adapters.kafka.batches import feeds_of

_FAUST_DRAIN = "faust.transport.consumer.Consumer._drain_messages"     # its entry in upstream.REPLACEMENTS


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
