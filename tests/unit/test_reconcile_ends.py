"""How the reconcile judges one record from what the tables hold about it (``app.reconcile.input``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.adapters.mysql.reconcile import ReceiptRow, StepRow
from app.reconcile.input import DONE, FAILED, PENDING, End, Read, Tally, judge, ledger_strays
from app.reconcile.report import Report

ORDER = "ORD-20261206-R1"
LOCAL, WAYBILL = f"{ORDER}:ORDER_CONFIRM:mark_confirmed", f"{ORDER}:ORDER_CONFIRM:issue_waybill"
CONFIRM = Read(order_no=ORDER, type="ORDER_CONFIRM", local_key=LOCAL, effect_keys=(WAYBILL,),
               receipt_keys=frozenset({WAYBILL}))


def row(key, status=DONE, outcome="applied", age=1.0, token="t1"):
    return StepRow(key, status, outcome, 1, token, age)


def verdict(read=CONFIRM, *, steps=(), receipts=(), ledger=(), committed=100, offset=7, seen=None):
    return judge(read, ledger=list(ledger), committed=committed, offset=offset, steps={s.biz_key: s for s in steps},
                 receipts={r.biz_key: r for r in receipts}, stuck_after=600, seen=set() if seen is None else seen)


RECEIPT = ReceiptRow(ORDER, WAYBILL, "t1", "WB1")


@pytest.mark.parametrize("case, kwargs, end", [
    ("done with its receipt", dict(steps=[row(LOCAL), row(WAYBILL, outcome="waybill_issued")], receipts=[RECEIPT]),
     End.DONE),
    ("a dead letter wins over any row", dict(ledger=[{"id": 3, "reason": "x", "status": 4}]), End.DEAD_LETTER),
    ("past the committed offset", dict(committed=7), End.UNREAD),
    ("nothing committed", dict(committed=None), End.UNREAD),
    ("local step stale", dict(steps=[row(LOCAL, outcome="stale")]), End.SUPERSEDED),
    ("effect failed stale", dict(steps=[row(LOCAL), row(WAYBILL, FAILED, "stale")]), End.SUPERSEDED),
    ("no local row: lost", dict(steps=[]), End.UNACCOUNTED),
    ("no effect row: lost", dict(steps=[row(LOCAL)]), End.UNACCOUNTED),
    ("effect failed with no dead letter", dict(steps=[row(LOCAL), row(WAYBILL, FAILED, "effect_rejected")]),
     End.UNACCOUNTED),
    ("pending, young", dict(steps=[row(LOCAL), row(WAYBILL, PENDING, None, age=30)]), End.IN_PROGRESS),
    ("pending past the threshold", dict(steps=[row(LOCAL), row(WAYBILL, PENDING, None, age=601)]), End.STUCK),
    ("receipt deleted", dict(steps=[row(LOCAL), row(WAYBILL)]), End.RECEIPT_MISMATCH),
    ("receipt of another token", dict(steps=[row(LOCAL), row(WAYBILL, token="t2")], receipts=[RECEIPT]),
     End.RECEIPT_MISMATCH),
])
def test_each_way_a_record_ends(case, kwargs, end):
    assert verdict(**kwargs).end is end, case


def test_a_second_record_of_a_request_is_a_duplicate_and_a_skipped_type_is_skipped():
    seen: set = set()
    done = dict(steps=[row(LOCAL), row(WAYBILL)], receipts=[RECEIPT], seen=seen)
    assert [verdict(**done).end, verdict(**done).end] == [End.DONE, End.DUPLICATE]
    assert verdict(Read(skipped_type="ORDER_SHIPPED")).end is End.SKIPPED
    malformed = verdict(Read(malformed="not_json"))
    assert malformed.end is End.UNACCOUNTED and "not_json" in malformed.why


def test_a_ledger_row_naming_an_offset_without_a_record_is_a_stray():
    rows = [{"src_offset": 5, "id": 1}, {"src_offset": 9, "id": 2}]
    assert ledger_strays(rows, {5, 6, 7}) == [{"src_offset": 9, "id": 2}]


def test_the_report_counts_every_end_keeps_the_first_findings_and_says_them():
    tally = Tally(keep=2)
    for offset in range(5):
        tally.add(verdict(steps=[]), topic="t", partition=0, offset=offset, order_no=ORDER, type_="ORDER_CONFIRM")
    tally.add(verdict(steps=[row(LOCAL), row(WAYBILL)], receipts=[RECEIPT]), topic="t", partition=0, offset=5,
              order_no=ORDER, type_="ORDER_CONFIRM")
    report = Report("g", "t", datetime(2026, 12, 6, 10, tzinfo=UTC), datetime(2026, 12, 6, 11, tzinfo=UTC), "cli:a",
                    tally=tally, seconds=2.0)
    d = report.as_dict()
    assert (report.status, d["records"], d["findings_total"], d["findings_shown"]) == ("findings", 6, 5, 2)
    assert d["ends"]["unaccounted"] == 5 and d["ends"]["done"] == 1 and d["records_per_second"] == 3.0
    assert "FINDINGS: 5 (5 unaccounted)" in report.text() and "... and 3 more" in report.text()
    assert Report("g", "t", report.since, report.until, "x").status == "clean"


def test_the_report_lists_the_types_skipped_by_count_and_which_nobody_declared():
    tally = Tally()
    tally.MAX_SKIPPED_TYPES = 3
    for type_, n in (("ORDER_SHIPPED", 5), ("ORDER_RETURNED", 2), ("X1", 1), ("X2", 1), ("X3", 4)):
        for offset in range(n):
            tally.add(verdict(Read(skipped_type=type_)), topic="t", partition=0, offset=offset, order_no=None,
                      type_=type_)
    report = Report("g", "t", datetime(2026, 12, 6, 10, tzinfo=UTC), datetime(2026, 12, 6, 11, tzinfo=UTC), "cli:a",
                    tally=tally, seconds=1.0, foreign=frozenset({"ORDER_SHIPPED"}))
    d = report.as_dict()
    assert d["ends"]["skipped"] == 13 and report.status == "clean"
    assert d["skipped_types"] == [{"type": "ORDER_SHIPPED", "records": 5, "declared": True},
                                  {"type": "ORDER_RETURNED", "records": 2, "declared": False},
                                  {"type": "X1", "records": 1, "declared": False},
                                  {"type": None, "records": 5, "declared": False}]
    assert ("skipped by type: 5 'ORDER_SHIPPED', 2 'ORDER_RETURNED' (not in FOREIGN_EVENT_TYPES), 1 'X1' (not in "
            "FOREIGN_EVENT_TYPES), 5 of other types") in report.text()
    assert Report("g", "t", report.since, report.until, "x").as_dict()["skipped_types"] == []
