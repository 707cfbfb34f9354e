"""The dead-letter topic's records, each to its ledger row: the dead-letter agent hands them over
(``agents/compensator.py``, in batches of at most 10), and each is acknowledged once it is handled.

A record whose row is due is redriven at once; one not due yet wakes the drain of due rows
(``app.compensation.due``) to run it when it is, so nothing loops through Kafka. A record the
ledger cannot take as it is (anything a person or a replay tool may write on the topic) becomes a
row for a person: one the client could not read, one whose headers do not say where it came from
(``unreadable_dead_letter``), one with no ledger row (``no_ledger_row``), one the ledger refused
(``unstorable_dead_letter``); failing that, a log line. It never stops the worker. A record of
another consumer group is left to that group.
"""

from __future__ import annotations

import asyncio
import logging

from app.compensation.due import DueRows
from app.compensation.headers import origin_group, source_of
from app.compensation.redrive import Redriver
from app.pipeline.errors import Fatal
from app.pipeline.model import SourceKey
from app.pipeline.ports import SourceRecord
from app.pipeline.states import LEDGER_SETTLED, LedgerStatus

log = logging.getLogger(__name__)


class DeadLetters:
    def __init__(self, redriver: Redriver, due: DueRows) -> None:
        self.redriver, self.due = redriver, due
        self.ledger = redriver.ledger
        self.group = redriver.group

    async def handle(self, record: SourceRecord, guard) -> str:
        """One record of the dead-letter topic: it is acknowledged once this returns. A record
        the ledger cannot take (anything a person or a replay tool may write there) becomes a
        row for a person, or at least a log line; it never stops the worker."""
        try:
            return await self._handle(record, guard)
        except (Fatal, asyncio.CancelledError):
            raise
        except Exception as exc:
            log.exception("dead letter %s[%s]@%s could not be handled: %r", record.topic, record.partition,
                          record.offset, exc)
        bare = SourceRecord(record.topic, record.partition, record.offset, record.timestamp_ms, None, None)
        try:
            row = await guard(lambda: self.ledger.add_manual(
                SourceKey(self.group, record.topic, record.partition, record.offset,
                          -1 if record.timestamp_ms is None else record.timestamp_ms),
                bare, "unstorable_dead_letter", "the ledger could not take this dead letter as it is; read it on "
                                                f"the topic at {record.topic}[{record.partition}]@{record.offset}"))
        except Fatal:
            raise
        except Exception:
            log.exception("dead letter %s[%s]@%s could not even be recorded for a person; it stays on the topic",
                          record.topic, record.partition, record.offset)
            return "unstorable"
        log.error("dead letter %s[%s]@%s: ledger row %s, manual (unstorable_dead_letter)", record.topic,
                  record.partition, record.offset, row.id)
        return "manual"

    async def _handle(self, record: SourceRecord, guard) -> str:
        if record.unreadable is not None:
            # A record batch on the dead-letter topic that the client could not read: one row for
            # all of its records, keyed by the first (the one whose value is the raw batch).
            run = record.unreadable
            row = await guard(lambda: self.ledger.add_manual(
                SourceKey(self.group, record.topic, record.partition, run.first,
                          -1 if record.timestamp_ms is None else record.timestamp_ms),
                record, run.reason, f"a dead letter the client could not read (offsets {run.first}..{run.last}): "
                                    f"{run.message}"))
            log.error("dead letters %s[%s]@%s..%s could not be read (%s): ledger row %s, manual", record.topic,
                      record.partition, run.first, run.last, run.reason, row.id)
            return "manual"
        group = origin_group(record)
        if group is not None and group != self.group:
            log.warning("dead letter %s[%s]@%s belongs to consumer group %r, not %r: left to it", record.topic,
                        record.partition, record.offset, group[:300], self.group)
            return "foreign"
        try:
            source = source_of(record)
        except ValueError as exc:
            why = str(exc)      # the except block unbinds exc; the lambda may run again under guard
            row = await guard(lambda: self.ledger.add_manual(
                SourceKey(self.group, record.topic, record.partition, record.offset,
                          -1 if record.timestamp_ms is None else record.timestamp_ms),
                record, "unreadable_dead_letter", f"the dead letter's headers do not say where it came from: {why}"))
            log.error("dead letter %s[%s]@%s has no usable origin headers (%s): ledger row %s, manual", record.topic,
                      record.partition, record.offset, why, row.id)
            return "manual"
        row = await guard(lambda: self.ledger.find(source))
        if row is None:
            row = await guard(lambda: self.ledger.add_manual(
                source, record, "no_ledger_row", "no ledger row for this dead letter (was it written by hand?)"))
            log.error("dead letter for %s[%s]@%s has no ledger row: row %s, manual", source.topic, source.partition,
                      source.offset, row.id)
            return "manual"
        if row.status in LEDGER_SETTLED or row.status is LedgerStatus.MANUAL:
            return row.status.name.lower()
        if row.retriable and not row.due:
            self.due.wake()
            return "not_due"         # the drain runs it when it is due; nothing loops through Kafka
        status = await self.redriver.work(row, guard, actor="compensator")
        return "busy" if status is None else status.name.lower()
