"""The capacity model of the dedup store: how much a crash replays, how long t_idem
must remember, and how big that makes it.

**The replay window W** is a number of events, not a time: the events a worker had
processed (their steps are done in t_idem) but whose offsets were not committed yet
when it died. They are delivered again, found done, and skipped. Faust commits the
acknowledged offsets every ``commit_interval`` seconds, or as soon as ``commit_every``
events were acknowledged, and the batch in flight is acknowledged when it ends. For a
worker processing ``r`` events/s:

* lower bound, one worker killed (kill -9, OOM): ``W <= min(r x commit_interval,
  commit_every) + the batch in flight``, the batch being at most ``batch_size`` and, for
  a worker keeping up, about ``r x batch_within``. Batches are acknowledged whole, so the
  first term is rounded up to whole batches (and Faust checks ``commit_every`` between
  batches: it may be passed by one). On average W is about half of the bound.
  ``r`` is the worker's share of the peak rate while it keeps up, and its ceiling while
  it works off a backlog (after a restart, an outage). ``max.poll.records`` bounds what
  one fetch brings, not W: records fetched and not processed yet are delivered again but
  not found done. A clean stop (SIGTERM, a rebalance) finishes the batch and commits:
  W = 0.
* upper bound, offsets lost (the group stopped for longer than the broker's
  ``offsets.retention``, or reset): W is everything still in the topic, ``rate x the
  stop``: the consumers start again from the earliest offset.

**Retention**: t_idem must remember a key for as long as its event can come back:
the longest of the offsets retention (after it, everything comes back), the outage
the service must survive, and the dead-letter window (a dead letter is redriven from
the ledger while it is open), times a safety factor.

**Rows**: t_idem holds a row for *every* step key of every event of the retention, not
only the replayed ones, and a monthly partition is dropped only once all of it is past
the retention, so up to a month more: ``rate x 86,400 x keys per event x (retention + 31)``.
(A model that multiplies W by the number of crashes a day sizes the replays, not the
table: the table must hold every key that may be seen again.) The budget is that many
rows; the watermark metric divides the table's rows by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DAY = 86_400
MONTH_SLACK_DAYS = 31        # a partition goes once all of it is past the retention


@dataclass(frozen=True)
class Inputs:
    rate: float                    # events/s, averaged over a day, all partitions
    peak_rate: float               # events/s of the group at the busiest hour
    worker_max_rate: float         # events/s one worker reaches working off a backlog
    partitions: int
    workers: int
    retention_days: float          # IDEM_RETENTION_DAYS
    commit_interval: float         # BROKER_COMMIT_INTERVAL_SECONDS
    commit_every: int              # BROKER_COMMIT_EVERY
    max_poll_records: int          # BROKER_MAX_POLL_RECORDS
    batch_size: int                # BATCH_SIZE
    batch_within: float            # BATCH_WITHIN_SECONDS
    keys_per_event: float          # t_idem rows per event (local step + effect steps)
    row_bytes: float               # bytes per t_idem row, indexes included (measured)
    offsets_retention_days: float
    outage_sla_days: float
    dead_letter_days: float
    safety: float = 2.0


@dataclass(frozen=True)
class Budget:
    inputs: Inputs
    w_kill: int                    # one worker killed while keeping up at the peak: at most this many
    w_kill_typical: int            # ... on average
    w_kill_backlog: int            # one worker killed while working off a backlog
    w_kill_all: int                # every worker killed at once, at the peak
    w_outage_per_hour: int         # offsets lost: events delivered again per hour of the stop
    w_offsets_expired: int         # offsets lost after a stop as long as the offsets retention
    replay_rows: int               # t_idem rows the worst kill's replay reads again (they must be there)
    retention_needed_days: float
    rows: int                      # t_idem rows at the retention (the budget)
    bytes: int

    @property
    def retention_ok(self) -> bool:
        return self.inputs.retention_days >= self.retention_needed_days


def window(i: Inputs, rate: float) -> tuple[int, int]:
    """(acknowledged and not committed, the batch in flight) at most, for a worker processing ``rate``
    events/s: batches of ``min(batch_size, rate x batch_within)`` events, acknowledged whole."""
    batch = min(i.batch_size, max(math.ceil(rate * i.batch_within), 1))
    per_interval = batch * math.ceil(rate * i.commit_interval / batch)
    return min(per_interval, i.commit_every + batch), batch


def budget(i: Inputs) -> Budget:
    acked, in_flight = window(i, i.peak_rate / max(i.workers, 1))
    backlog_acked, backlog_batch = window(i, i.worker_max_rate)
    w_kill = acked + in_flight
    w_backlog = backlog_acked + backlog_batch
    needed = max(i.offsets_retention_days, i.outage_sla_days, i.dead_letter_days) * i.safety
    rows = math.ceil(i.rate * DAY * i.keys_per_event * (i.retention_days + MONTH_SLACK_DAYS))
    return Budget(
        inputs=i,
        w_kill=w_kill,
        w_kill_typical=math.ceil((acked + in_flight) / 2),
        w_kill_backlog=w_backlog,
        w_kill_all=i.workers * w_kill,
        w_outage_per_hour=math.ceil(i.rate * 3600),
        w_offsets_expired=math.ceil(i.rate * DAY * i.offsets_retention_days),
        replay_rows=math.ceil(max(w_kill, w_backlog) * i.keys_per_event),
        retention_needed_days=needed,
        rows=rows,
        bytes=math.ceil(rows * i.row_bytes),
    )
