"""After the storm: wait, within a bound, until the run has settled.

Settled means all of:

    order-event       the group's committed offsets at the end of every partition
    order-event-dlq   the same (the compensator has taken every dead letter)
    t_compensation    no row open or retrying; every manual row carries a reason
    t_idem            no pending row

A bound that passes is a failure that says which of these was not reached and where
the workers' logs are.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import closing
from dataclasses import dataclass, field

import pymysql

from app.adapters.kafka import ops as kafka_ops
from harness.services import ROOT

STATUSES = {1: "open", 2: "retrying", 3: "compensated", 4: "manual", 5: "discarded", 6: "superseded", 7: "resolved"}


class DrainTimeout(AssertionError):
    """The run did not settle within its bound."""


@dataclass
class Backlog:
    behind: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)   # topic -> p -> (committed, end)
    ledger: dict[str, int] = field(default_factory=dict)                          # status -> rows
    manual_without_reason: int = 0
    pending: int = 0
    abandoned: list[dict] = field(default_factory=list)     # retrying rows whose claim ran out

    @property
    def open_left(self) -> int:
        return self.ledger.get("open", 0) + self.ledger.get("retrying", 0)

    @property
    def settled(self) -> bool:
        return not any(self.behind.values()) and self.open_left == 0 and not self.manual_without_reason \
            and self.pending == 0

    def unsettled(self) -> str:
        parts = [f"{topic}: committed short of the end on partitions {behind}"
                 for topic, behind in self.behind.items() if behind]
        if self.open_left:
            parts.append(f"t_compensation: {self.ledger.get('open', 0)} open, "
                         f"{self.ledger.get('retrying', 0)} retrying")
        if self.abandoned:
            parts.append(f"of them retrying with a claim that ran out: {self.abandoned}")
        if self.manual_without_reason:
            parts.append(f"t_compensation: {self.manual_without_reason} manual rows without a reason")
        if self.pending:
            parts.append(f"t_idem: {self.pending} rows pending")
        return "; ".join(parts) or "nothing"


def read_backlog(kafka: kafka_ops.Kafka, group: str, topics: dict[str, int], mysql: dict) -> Backlog:
    backlog = Backlog()
    for topic, partitions in topics.items():
        ends = asyncio.run(kafka_ops.end_offsets(kafka, topic, partitions))
        committed = asyncio.run(kafka_ops.committed_offsets(kafka, group, topic, partitions))
        backlog.behind[topic] = {p: (committed[p], ends[p]) for p in ends if committed[p] < ends[p]}
    conn = pymysql.connect(host=mysql["host"], port=mysql["port"], user=mysql["user"], password=mysql["password"],
                           database=mysql["database"], autocommit=True, connect_timeout=5, read_timeout=30)
    with closing(conn), conn.cursor() as cur:
        cur.execute("SELECT status, COUNT(*) FROM t_compensation GROUP BY status")
        backlog.ledger = {STATUSES.get(status, str(status)): n for status, n in cur.fetchall()}
        cur.execute("SELECT COUNT(*) FROM t_compensation WHERE status = 4 AND TRIM(reason) = ''")
        backlog.manual_without_reason = cur.fetchone()[0]
        cur.execute("SELECT COUNT(*) FROM t_idem WHERE status = 1")
        backlog.pending = cur.fetchone()[0]
        # A claim nobody will finish (its compensator was killed): say which, and whose.
        cur.execute("SELECT id, reason, owner, lease_until, TIMESTAMPDIFF(SECOND, lease_until, NOW(3)) "
                    "FROM t_compensation WHERE status = 2 AND lease_until < NOW(3) ORDER BY id LIMIT 10")
        backlog.abandoned = [{"id": row_id, "reason": reason, "owner": owner, "lease_until": str(until),
                              "expired_seconds_ago": ago} for row_id, reason, owner, until, ago in cur.fetchall()]
    return backlog


def wait_settled(read, *, timeout: float, fleet, say=print, interval: float = 1.0) -> tuple[Backlog, float]:
    """Poll ``read()`` until the backlog is settled; keep the fleet supervised meanwhile.
    Returns the last backlog and the seconds it took; raises :class:`DrainTimeout`."""
    started = time.monotonic()
    last_said = 0.0
    backlog = None
    while True:
        fleet.watch()
        try:
            backlog = read()
        except Exception as exc:           # a read that fails is a poll that did not see it settle
            say(f"drain: could not read the backlog ({exc!r})")
        elapsed = time.monotonic() - started
        if backlog is not None and backlog.settled:
            return backlog, elapsed
        if elapsed > timeout:
            logs = ", ".join(str(i.worker.log_path.relative_to(ROOT)) for i in fleet.live.values())
            raise DrainTimeout(f"the run did not settle within {timeout:.0f}s of the faults' end: "
                               f"{backlog.unsettled() if backlog else 'the backlog could not be read'}"
                               f"{'; the live workers: ' + logs if logs else ''}")
        if elapsed - last_said >= 10:
            last_said = elapsed
            say(f"drain: {backlog.unsettled() if backlog else '?'} ({elapsed:.0f}s)")
        time.sleep(interval)
