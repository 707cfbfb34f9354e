"""The chaos run's outbox upstream, without the relay: what the order service writes for each planned
record reads back, through the workers' outbox envelope, as the same event (or as the malformed
record it stands for, with a reason the checker accepts), and the topic's copies become the
manifest's entries, a copy sent again an exact duplicate, a record of no committed row a stray."""

from __future__ import annotations

import pytest

from app.pipeline.envelopes import Envelope, Reading
from app.pipeline.errors import MalformedEvent, UnhandledType
from app.pipeline.events import decode
from harness.chaos import outbox, rules
from harness.chaos.evidence import TopicRecord
from harness.chaos.workload import Shares, plan

OUTBOX = Reading(envelope=Envelope.OUTBOX)


@pytest.fixture(scope="module")
def workload():
    return plan(11, min_events=3_000, min_orders=600, partitions=8, shares=Shares(**outbox.SHARES))


def as_relayed(row: outbox.Row, partition: int = 0, offset: int = 0) -> TopicRecord:
    """The record the EventRouter makes of a row."""
    return TopicRecord(partition, offset, 1_764_400_000_000, row.aggregateid.encode(), row.payload.encode(),
                       (("id", row.id.encode()), ("eventType", row.type.encode())))


def read(record: TopicRecord):
    return decode(record.key, record.value, max_bytes=1 << 20, headers=record.headers,
                  timestamp_ms=record.timestamp, reading=OUTBOX)


def test_an_outbox_plan_has_no_record_an_outbox_cannot_hold(workload):
    kinds = {r.malformed_kind for r in workload.records if r.kind == "malformed"}
    assert kinds == set(outbox.SHARES["malformed_kinds"])
    assert workload.count("exact_duplicate") == 0 and not any(r.java for r in workload.records)
    assert workload.count("republished") > 0


def test_every_valid_record_reads_back_as_its_event(workload):
    for record in workload.records:
        if record.kind == "malformed":
            continue
        event = read(as_relayed(outbox.outbox_row(record)))
        assert (str(event.event_id), event.order_no, event.type.value) == (record.event_id, record.order_no,
                                                                          record.type)


def test_every_malformed_record_is_dead_lettered_with_a_reason_its_label_fits(workload):
    entries, _ = outbox.manifest_entries(
        workload.records, [outbox.outbox_row(r) for r in workload.records],
        [as_relayed(outbox.outbox_row(r), 0, i) for i, r in enumerate(workload.records)],
        [0.0] * len(workload.records), [1.0] * len(workload.records))
    for record, entry in zip(workload.records, entries):
        if record.kind != "malformed":
            continue
        with pytest.raises(MalformedEvent) as caught:
            read(as_relayed(outbox.outbox_row(record)))
        if entry["malformed_kind"] == "bad_type":
            assert isinstance(caught.value, UnhandledType)
        assert rules.reason_fits(entry["malformed_kind"], caught.value.reason), (entry, caught.value.reason)


def test_copies_become_the_first_entry_then_exact_duplicates_and_strays_are_named(workload):
    records = [r for r in workload.records if r.kind != "malformed"][:3]
    rows = [outbox.outbox_row(r) for r in records]
    decoy = outbox.Row("a-rolled-back-id", rows[0].aggregateid, "ORDER_CANCEL", "{}")
    copies = [as_relayed(rows[1], 2, 10), as_relayed(rows[0], 2, 11), as_relayed(rows[1], 2, 12),
              as_relayed(decoy, 2, 13), as_relayed(rows[2], 2, 14)]
    committed = [5.0, 6.0, None]                     # the third row's transaction never committed
    entries, strays = outbox.manifest_entries(records, rows, copies, [1.0, 2.0, 3.0], committed)
    assert [(e["offset"], e["kind"], e["event_id"]) for e in entries] == [
        (11, records[0].kind, records[0].event_id), (10, records[1].kind, records[1].event_id),
        (12, "exact_duplicate", records[1].event_id)]
    again = entries[2]
    assert again["duplicate_of"] == records[1].event_id and again["relayed_again"] and not again["late"]
    assert entries[0]["digest"] == rows[0].digest and entries[0]["acked_at"] == 5.0
    assert len(strays) == 2 and "a-rolled-back-id" in strays[0] and "@14" in strays[1]
