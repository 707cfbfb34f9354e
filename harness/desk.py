"""A main pipeline that dead-letters and a compensator that works the letters, in this
process, on real MariaDB and the fake services over real HTTP (the ``harness`` fixture)."""

from __future__ import annotations

import asyncio
import uuid

from app.adapters.kafka.dlq import outgoing
from app.adapters.mysql.ledger.port import MySqlLedger
from app.compensation.compensator import Compensator
from app.compensation.rules import Backoff
from app.pipeline.outage import OutageGuard
from app.pipeline.ports import SourceRecord
from harness.events import order_no
from harness.pipeline import MemorySink, source

# The desk's dead-letter backoff: short, so a test's letters come due in a second or so.
DESK_BACKOFF = Backoff(0.2, 0.4, 3)


class Desk:
    """A main pipeline that dead-letters, and a compensator that works the letters."""

    def __init__(self, harness, main, compensator_processor, *, retry_after: int, backoff: Backoff,
                 group: str | None = None) -> None:
        self.h, self.main = harness, main
        self.group = group or f"cmp-{uuid.uuid4().hex[:8]}"          # this test's ledger rows only
        self.sink = MemorySink()
        self.batches = harness.batches(main, self.sink, dlq_retry_after=retry_after, group=self.group)
        self.ledger = MySqlLedger(main.store)
        self.compensator = Compensator(compensator_processor, self.ledger, group=self.group, backoff=backoff,
                                       lease_seconds=30, max_event_bytes=1 << 20)
        self.guard = OutageGuard(10)
        self._offset = 0

    async def dead_letters(self, docs: list[dict]) -> list[SourceRecord]:
        """Run ``docs`` through the main pipeline; return its dead letters as the topic has them
        (once the main worker's claims, 0.5 s, have run out, as they have when a retry is due)."""
        before = len(self.sink.sent)
        await self.batches.handle([source(doc) for doc in docs])
        await self._claims_run_out(sorted({doc["order_no"] for doc in docs}))
        records = []
        for letter in self.sink.sent[before:]:
            out = outgoing(letter, self.group, truncate_bytes=65536)
            self._offset += 1
            records.append(SourceRecord("test-dlq", 0, self._offset, 1, out.key, out.value, tuple(out.headers)))
        return records

    async def _claims_run_out(self, orders: list[str], within: float = 30.0) -> None:
        """Until no step of ``orders`` is pending under a live lease (the database's clock): a
        condition, not a sleep, so that a loaded machine cannot make a test see a claim still live."""
        likes = " OR ".join(["biz_key LIKE %s"] * len(orders))
        sql = f"SELECT COUNT(*) AS n FROM t_idem WHERE status = 1 AND lease_until >= UTC_TIMESTAMP(3) AND ({likes})"
        args = [f"{order}:%" for order in orders]
        deadline = asyncio.get_running_loop().time() + within
        while self.h.db.query(sql, *args)[0]["n"]:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"claims of {orders} still live after {within:g} s")
            await asyncio.sleep(0.05)

    def row(self, record: SourceRecord) -> dict:
        headers = {k: v.decode() for k, v in record.headers}
        [row] = self.h.db.query("SELECT * FROM t_compensation WHERE consumer_group = %s AND src_topic = %s AND "
                                "src_offset = %s", self.group, headers["dlq.original.topic"],
                                headers["dlq.original.offset"])
        return row

    def history(self, row_id: int) -> list[dict]:
        return self.h.db.query("SELECT * FROM t_compensation_audit WHERE compensation_id = %s ORDER BY id", row_id)


async def desk(harness, *, retry_after: int = 0, backoff: Backoff = DESK_BACKOFF, lookup: bool = True,
               settle: float = 0.5, main_lookup: bool | None = None, group: str | None = None,
               limits=None) -> Desk:
    """``limits``: the provider limits both share, as a worker's processors do (default: each its own)."""
    main = await harness.processor(owner=f"main/main/{order_no()}", sms_lookup=lookup if main_lookup is None
                                   else main_lookup, settle=settle, lease=0.5, timeout=0.4, limits=limits)
    helper = await harness.processor(owner=f"w/compensator/{order_no()}", store=main.store, sms_lookup=lookup,
                                     settle=settle, limits=limits)
    return Desk(harness, main, helper, retry_after=retry_after, backoff=backoff, group=group)
