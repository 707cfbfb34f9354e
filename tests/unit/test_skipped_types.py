"""Types not handled are counted and said in the log once per type per interval; the counter's label
is a type's name only when FOREIGN_EVENT_TYPES declares it (any other type is `other`: a record never
creates a series), and what goes to t_skipped_type keeps a bounded number of names."""

from __future__ import annotations

import logging

from app.observability.metrics import SKIPPED, SkippedTypes


def value(label: str) -> float:
    return SKIPPED.labels(label)._value.get()


def test_each_type_is_counted_and_logged_once_per_interval(caplog):
    now = [0.0]
    skipped = SkippedTypes(every=60, clock=lambda: now[0])
    skipped.declare(frozenset({"T_SHIPPED_UNIT"}))
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
    assert skipped.take() == {"T_SHIPPED_UNIT": (8, None)}


def test_a_type_nobody_declared_is_logged_by_name_and_counted_as_other(caplog):
    skipped = SkippedTypes(every=60, clock=lambda: 0.0)
    before = value("other")
    with caplog.at_level(logging.INFO, logger="app.observability.metrics"):
        skipped.record({"T_RANDOM_UNIT_x9": 2}, {"T_RANDOM_UNIT_x9": ("t", 0, 7)})
    assert value("other") - before == 2
    assert ("type", "T_RANDOM_UNIT_x9") not in {(k, v) for labels in SKIPPED._metrics for k, v in
                                                  zip(SKIPPED._labelnames, labels, strict=True)}
    assert any("'T_RANDOM_UNIT_x9'" in r.getMessage() for r in caplog.records)
    assert skipped.take() == {"T_RANDOM_UNIT_x9": (2, ("t", 0, 7))}


def test_types_past_the_bound_are_kept_as_other_for_the_table():
    skipped = SkippedTypes(every=60, clock=lambda: 0.0)
    skipped.MAX_TYPES = 2
    skipped.record({"T_A_UNIT": 1, "T_B_UNIT": 1, "T_C_UNIT": 5})
    assert skipped.take() == {"T_A_UNIT": (1, None), "T_B_UNIT": (1, None), "other": (5, None)}
