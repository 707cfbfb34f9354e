"""A Faust monitor without per-event work, exporting what operators need.

Faust's default ``Monitor`` and its Prometheus sensor do bookkeeping for every
message and every event (dictionaries of timestamps, histograms with
topic/partition labels); the Prometheus sensor alone cost a no-op ``take_events()``
agent a large part of its throughput (the docs' Benchmarks page, bench/results/history.md and
the Operations page's Metrics; ``make bench`` row f is that agent). The processor counts
per batch instead (``app.observability.metrics``), and this monitor keeps only what happens
per commit, send and rebalance.
"""

from __future__ import annotations

import time
from typing import Any

from faust.sensors import Monitor
from prometheus_client import Counter, Histogram

from app.observability.metrics import LAST_COMMIT

COMMIT_SECONDS = Histogram("order_kafka_commit_seconds", "Offset commits: latency.",
                           buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5))
REBALANCES = Counter("order_kafka_rebalances_total", "Consumer group rebalances this worker went through.")
REBALANCE_SECONDS = Histogram("order_kafka_rebalance_seconds", "Rebalances: time until fully done.",
                              buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120))


class BatchLevelMonitor(Monitor):
    def on_message_in(self, tp, offset, message) -> None:
        pass

    def on_stream_event_in(self, tp, offset, stream, event) -> None:
        return None

    def on_stream_event_out(self, tp, offset, stream, event, state=None) -> None:
        pass

    def on_message_out(self, tp, offset, message) -> None:
        pass

    def on_topic_buffer_full(self, tp) -> None:
        pass

    def on_commit_completed(self, consumer, state: Any) -> None:
        super().on_commit_completed(consumer, state)
        COMMIT_SECONDS.observe(self.time() - state)

    def on_tp_commit(self, tp_offsets) -> None:
        super().on_tp_commit(tp_offsets)
        if tp_offsets:
            LAST_COMMIT.set(time.time())

    def on_rebalance_start(self, app) -> dict:
        REBALANCES.inc()
        return super().on_rebalance_start(app)

    def on_rebalance_end(self, app, state: dict) -> None:
        super().on_rebalance_end(app, state)
        REBALANCE_SECONDS.observe(state["latency_end"])
