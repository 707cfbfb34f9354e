"""Reading and planning: a batch's records become events, grouped by order (offset order within
each); a record that is no event becomes a letter of its own (a loose letter: it belongs to no order);
a run of records the client could not read, of one record batch, is one letter for all of them; a
record of a type this worker does not handle is finished as it is, counted by its type (unless the
reading says such records are dead-lettered)."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import app.pipeline.batch.dead_letters as dead_letters
from app.pipeline.batch.state import Batch, Item
from app.pipeline.envelopes import Reading
from app.pipeline.errors import InternalError, MalformedEvent, UnhandledType
from app.pipeline.events import check_headers, decode
from app.pipeline.ports import DeadLetter, SourceRecord

log = logging.getLogger(__name__)

Loose = list[tuple[DeadLetter, list[int]]]      # a letter, and the indices of the records it stands for


@dataclass
class Read:
    """What a batch holds, as read."""

    orders: dict[str, list[Item]]       # each order's events, in offset order
    loose: Loose                        # the letters of records that are no event
    skipped: list[int]                  # records of types not handled: finished as they are


def read(batch: Batch, records: Sequence[SourceRecord], reading: Reading) -> Read:
    """Decode ``records``; an observer following the batch learns which record is which event."""
    items: list[Item] = []
    loose: Loose = []
    skipped: list[int] = []
    runs: dict[tuple[str, int, int], list[tuple[int, SourceRecord]]] = defaultdict(list)
    retention = batch.crew.processor.retention
    latest = retention.latest() if retention is not None else None
    max_bytes, worker_id, report = batch.crew.policy.max_event_bytes, batch.crew.identity.worker_id, batch.report
    for index, record in enumerate(records):
        if record.unreadable is not None:
            runs[record.topic, record.partition, record.unreadable.first].append((index, record))
            continue
        try:
            if record.headers:
                check_headers(record.headers)
            event = decode(record.key, record.value, max_bytes=max_bytes, latest=latest,
                           headers=record.headers, timestamp_ms=record.timestamp_ms, reading=reading)
        except UnhandledType as exc:
            if reading.skip_unhandled:            # not ours: finished as it is, counted by its type
                report.skipped[exc.type_name] += 1
                report.skipped_at[exc.type_name] = (record.topic, record.partition, record.offset)
                skipped.append(index)
            else:
                loose.append((dead_letters.of_record(record, exc, worker_id), [index]))
            continue
        except MalformedEvent as exc:
            loose.append((dead_letters.of_record(record, exc, worker_id), [index]))
            continue
        except Exception as exc:   # a decoder bug: this record goes aside, the worker goes on
            log.exception("decoder failed on %s[%s]@%s", record.topic, record.partition, record.offset)
            error = InternalError(f"decoder: {exc.__class__.__name__}: {exc}")
            loose.append((dead_letters.of_record(record, error, worker_id), [index]))
            continue
        items.append(Item(index, record, event))
    story = batch.story
    if story is not None:
        for item in items:
            item.trace = story.decoded(item.index, item.event)
        loose = [(story.dead_lettered(letter, indices), indices) for letter, indices in loose]
    for unread in runs.values():
        indices = [index for index, _ in unread]
        letter = dead_letters.of_run([record for _, record in unread], worker_id)
        if story is not None:
            letter = story.dead_lettered(letter, indices)
        loose.append((letter, indices))
        if len(unread) > 1:
            report.covered[letter.reason] += len(unread) - 1      # the run's reason
    orders: dict[str, list[Item]] = defaultdict(list)
    for item in items:
        orders[item.event.order_no].append(item)
    return Read(orders, loose, skipped)
