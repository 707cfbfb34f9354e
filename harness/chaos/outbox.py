"""The chaos run with an outbox upstream (``--outbox at-least-once|exactly-once``, ``make chaos
OUTBOX=...``): the planned records are not produced to ``order-event`` by the run, they are written by
an order service into its transactional outbox (``harness.outbox_relay``: its own MariaDB with the
binary log on), and Debezium's MySQL connector with the outbox EventRouter, in a Kafka Connect
worker, relays them; the workers read them with ``EVENT_ENVELOPE=outbox``.

What the order service does, at the run's pace:

    each planned record   one transaction: the order's row and the outbox row (id = the event id,
                          aggregateid = the order number, type, payload = the event's data)
    rolled back           before ~3 % of them, a transaction that writes a CANCEL of the same order
                          and rolls back: it is never in the binary log, so nothing may act on it
    Connect SIGKILLed     ``kills`` times while it writes, started again at once (``connect_kill`` and
                          ``connect_start`` in the run's faults); exactly once, Connect commits a
                          transaction every :data:`TRANSACTION_INTERVAL_MS`, so each kill aborts one
                          that holds records

What the run cannot write through an outbox is left out of its plan (:data:`SHARES`): exact duplicates
(an outbox row's id is its primary key; the relay makes them: an at-least-once relay sends again
what it had sent before a crash), records with neither key nor value, and bytes that are not UTF-8
(the payload is a text column). The other malformed kinds become rows an order service could commit:
a payload that is not JSON or not an object, an empty aggregate id, a type not handled, an amount
that is a string.

The manifest's entries come from the topic once every committed row is on it (read
``read_committed``): a record's first copy is its entry (the key and value the order service wrote
are its digest), every further copy an ``exact_duplicate`` of it, or a ``malformed`` record again;
a record of no committed row (a rolled-back transaction relayed) fails the run. ``figures`` gives
the relay's side: rows written and rolled back, the copies, the Connect restarts, and with
Connect's exactly-once support how many records of aborted transactions the log holds.
"""

from __future__ import annotations

import asyncio
import json
import queue
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass

from harness.chaos.evidence import TopicRead, TopicRecord, read_topic, record_digest
from harness.chaos.producer import ProducerFailed, SteadyProducer
from harness.chaos.workload import CANCEL, CREATED, Planned
from harness.outbox_relay import OutboxRelay

MODES = ("at-least-once", "exactly-once")
# Not in an outbox's plan: exact duplicates (the relay's own), records of neither key nor value, and
# bytes that are not UTF-8 (``Shares`` fields).
SHARES = {"exact_duplicate": 0.0, "null_records": 0,
          "malformed_kinds": ("not_json", "not_object", "no_order_no", "bad_type", "bad_amount")}
# A list as the payload is the event's data that is not an object (``bad_field:data``), not a value
# that is not a JSON object: the manifest labels it so (``rules.KIND_REASONS``).
LABELS = {"not_object": "data_not_object"}
ROLLED_BACK = 0.03                 # of the transactions, preceded by one rolled back
# Exactly once, Connect commits a transaction every this many milliseconds: a SIGKILL aborts the
# records of the open one, which the restarted task sends again.
TRANSACTION_INTERVAL_MS = 2000
RELAY_TIMEOUT = 600.0              # for the last committed row to be on the topic
POLL = 3.0
_IDS = uuid.UUID("6f1d8f0e-3c52-4b8e-9d41-0b7e4c2a9f10")
_GOOD = {"amount_cents": 100, "phone": "+8613800000000", "address": "1 Nowhere Road"}


@dataclass(frozen=True)
class Row:
    """An outbox row: what the EventRouter makes the record's ``id`` header, key, ``eventType``
    header and value of."""

    id: str
    aggregateid: str
    type: str
    payload: str

    @property
    def digest(self) -> str:
        return record_digest(self.aggregateid.encode(), self.payload.encode())


def outbox_row(record: Planned) -> Row:
    """The outbox row an order service writes for a planned record."""
    if record.kind != "malformed":
        doc = json.loads(record.value)
        return Row(doc["event_id"], doc["order_no"], doc["type"], json.dumps(doc["data"]))
    order_no = record.key.decode()
    event_id = str(uuid.uuid5(_IDS, order_no))
    shaped = {
        "not_json": Row(event_id, order_no, CREATED, '{"amount_cents": '),
        "not_object": Row(event_id, order_no, CREATED, json.dumps([_GOOD])),
        "no_order_no": Row(event_id, "", CREATED, json.dumps(_GOOD)),
        "bad_type": Row(event_id, order_no, "ORDER_TELEPORTED", json.dumps(_GOOD)),
        "bad_amount": Row(event_id, order_no, CREATED, json.dumps({**_GOOD, "amount_cents": "12.90"})),
    }
    if record.malformed_kind not in shaped:
        raise ValueError(f"an outbox holds no {record.malformed_kind} record")
    return shaped[record.malformed_kind]


def manifest_entries(records: list[Planned], rows: list[Row], copies: list[TopicRecord],
                     sent_at: list[float | None], committed_at: list[float | None]) -> tuple[list[dict], list[str]]:
    """The manifest's entries, in plan order and then the copies sent again, and the records on the
    topic no committed row explains (each named)."""
    index_of = {row.id: i for i, row in enumerate(rows)}
    first: dict[int, dict] = {}
    again: list[dict] = []
    strays: list[str] = []
    for copy in sorted(copies, key=lambda c: (c.partition, c.offset)):
        i = index_of.get(copy.header("id"))
        if i is None or committed_at[i] is None:
            strays.append(f"[{copy.partition}]@{copy.offset}: id {copy.header('id')!r}, type "
                          f"{copy.header('eventType')!r}, key {copy.key!r}")
            continue
        record = records[i]
        entry = {**record.entry(copy.partition, copy.offset), "digest": rows[i].digest,
                 "sent_at": sent_at[i], "acked_at": committed_at[i]}
        if record.malformed_kind in LABELS:
            entry["malformed_kind"] = LABELS[record.malformed_kind]
        if i not in first:
            first[i] = entry
        elif record.kind == "malformed":
            again.append({**entry, "relayed_again": True})
        else:
            again.append({**entry, "kind": "exact_duplicate", "duplicate_of": record.event_id, "late": False,
                          "relayed_again": True})
    return [first[i] for i in sorted(first)] + again, strays


class OutboxProducer(SteadyProducer):
    """:class:`SteadyProducer`'s pace and gates (the storm's), through an order service's outbox."""

    def __init__(self, relay: OutboxRelay, kafka: dict, group: str, records: list[Planned], rate: float, *,
                 kills: int, seed: int) -> None:
        super().__init__({"bootstrap_servers": relay.bootstrap}, relay.topic, records, rate)
        self.relay, self.kafka, self.group, self.kills = relay, kafka, group, kills
        self.rows = [outbox_row(record) for record in records]
        self.committed_at: list[float | None] = [None] * len(records)
        self.rng = random.Random(seed)
        self.log = lambda kind, detail=None: None      # the storm's log, once there is one
        self.figures: dict = {"relay": "exactly-once" if relay.exactly_once else "at-least-once",
                              "rows": 0, "rolled_back": 0, "connect_kills": 0, "connect_restart_seconds": []}
        self._queue: queue.Queue = queue.Queue()
        self._failed: BaseException | None = None

    async def run(self) -> list[dict]:
        writer = threading.Thread(target=self._write, name="order-service", daemon=True)
        writer.start()
        killer = asyncio.create_task(self._kill_connect())

        async def hand_over(index: int, record: Planned) -> None:
            if self._failed is not None:
                raise ProducerFailed(f"the order service could not write: {self._failed!r}")
            self._queue.put(index)

        try:
            await self.pace(hand_over)
        finally:
            self._queue.put(None)
            await asyncio.to_thread(writer.join)
            await killer
        if self._failed is not None:
            raise ProducerFailed(f"the order service could not write: {self._failed!r}")
        read = await self._relayed()
        entries, strays = manifest_entries(self.records, self.rows, read.records, self.sent_at, self.committed_at)
        if strays:
            raise ProducerFailed(f"{len(strays)} records on {self.topic} of no committed outbox row (a rolled-back "
                                 f"transaction relayed?): {strays[:5]}")
        copies = Counter(e["event_id"] for e in entries if e.get("relayed_again"))
        self.figures.update({"records": len(read.records), "relayed_again": sum(copies.values()),
                             "rows_relayed_again": len(copies)})
        if self.relay.exactly_once:
            everything = await read_topic(self.kafka, self.topic, self.group, isolation_level="read_uncommitted")
            self.figures["aborted_records"] = None if everything.error else len(everything.records) - len(read.records)
        for i, entry in enumerate(entries[:len(self.records)]):
            if entry.get("acked_at") is not None:
                self.acked[i] = (entry["partition"], entry["offset"], entry["acked_at"])
        return entries

    def _write(self) -> None:
        """The order service: one transaction per record, in plan order."""
        try:
            conn = self.relay.connect()
            with conn:
                while (index := self._queue.get()) is not None:
                    row = self.rows[index]
                    with conn.cursor() as cur:
                        if row.aggregateid and self.rng.random() < ROLLED_BACK:
                            self._order(cur, row.aggregateid, CANCEL)
                            self.relay.insert_event(cur, row.aggregateid, CANCEL, json.dumps({"reason": "rolled back"}))
                            conn.rollback()
                            self.figures["rolled_back"] += 1
                        if row.aggregateid:
                            self._order(cur, row.aggregateid, row.type)
                        self.relay.insert_event(cur, row.aggregateid, row.type, row.payload, event_id=row.id)
                        conn.commit()
                    self.committed_at[index] = time.time()
                    self.figures["rows"] += 1
        except BaseException as exc:        # the run fails with it, and the pace stops handing over
            self._failed = exc

    @staticmethod
    def _order(cur, order_no: str, status: str) -> None:
        cur.execute("INSERT INTO orders (order_no, status) VALUES (%s, %s) ON DUPLICATE KEY UPDATE status = "
                    "VALUES(status)", (order_no, status))

    async def _kill_connect(self) -> None:
        """SIGKILL the Connect worker at even shares of the records written, and start it again."""
        for k in range(1, self.kills + 1):
            at = len(self.records) * k // (self.kills + 1)
            while self.figures["rows"] < at and self._failed is None:
                await asyncio.sleep(0.2)
            if self._failed is not None:
                return
            await asyncio.to_thread(self.relay.kill_connect)
            self.figures["connect_kills"] += 1
            self.log("connect_kill", detail=f"the Connect worker SIGKILLed, {at:,} of the outbox rows written")
            seconds = await asyncio.to_thread(self.relay.restart_connect)
            self.figures["connect_restart_seconds"].append(round(seconds, 1))
            self.log("connect_start", detail=f"the connector RUNNING again after {seconds:.1f}s")

    async def _relayed(self) -> TopicRead:
        """The topic (``read_committed``) once every committed row is on it."""
        wanted = {row.id for row, at in zip(self.rows, self.committed_at) if at is not None}
        deadline = time.monotonic() + RELAY_TIMEOUT
        while True:
            read = await read_topic(self.kafka, self.topic, self.group)
            missing = wanted - {r.header("id") for r in read.records}
            if not read.error and not missing:
                return read
            if time.monotonic() > deadline:
                raise ProducerFailed(f"{len(missing):,} committed outbox rows not on {self.topic} after "
                                     f"{RELAY_TIMEOUT:g}s ({read.error or 'read to its end'}), e.g. {sorted(missing)[:3]}")
            await asyncio.sleep(POLL)
