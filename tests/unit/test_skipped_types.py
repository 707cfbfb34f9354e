"""Types not handled are counted by type and said in the log once per type per interval, with a
bounded number of label values."""

from __future__ import annotations

import logging

from app.observability.metrics import SKIPPED, SkippedTypes


def value(label: str) -> float:
    return SKIPPED.labels(label)._value.get()


def test_each_type_is_counted_and_logged_once_per_interval(caplog):
    now = [0.0]
    skipped = SkippedTypes(every=60, clock=lambda: now[0])
    before = value("T_SHIPPED_UNIT")
    with caplog.at_level(logging.INFO, logger="app.observability.metrics"):
        skipped.record({"T_SHIPPED_UNIT": 3})
        now[0] = 30
        skipped.record({"T_SHIPPED_UNIT": 4})
        now[0] = 61
        skipped.record({"T_SHIPPED_UNIT": 1})
    said = [r.getMessage() for r in caplog.records if "T_SHIPPED_UNIT" in r.getMessage()]
    assert len(said) == 2 and said[0].startswith("skipped 3 event(s)") and said[1].startswith("skipped 5 event(s)")
    assert value("T_SHIPPED_UNIT") - before == 8


def test_types_past_the_bound_count_as_other():
    skipped = SkippedTypes(every=60, clock=lambda: 0.0)
    skipped.MAX_TYPES = 2
    before = value("other")
    skipped.record({"T_A_UNIT": 1, "T_B_UNIT": 1, "T_C_UNIT": 5})
    assert value("other") - before == 5
