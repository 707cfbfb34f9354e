"""The checker compares the product's reconcile of a chaos run with its own verdicts, record by record,
and any difference is a violation naming the record (``harness.chaos.agreement``)."""

from __future__ import annotations

import json

from harness.chaos.accounting import Findings
from harness.chaos.agreement import check_agreement

PRODUCED = [
    {"partition": 0, "offset": 0, "kind": "original", "type": "ORDER_CREATED", "order_no": "O1"},
    {"partition": 0, "offset": 1, "kind": "exact_duplicate", "type": "ORDER_CREATED", "order_no": "O1"},
    {"partition": 1, "offset": 0, "kind": "original", "type": "ORDER_CONFIRM", "order_no": "O2"},
    {"partition": 1, "offset": 1, "kind": "malformed", "malformed_kind": "not_json", "order_no": None},
    {"partition": 1, "offset": 2, "kind": "malformed", "malformed_kind": "bad_type", "order_no": None},
]
CHECKER = {(0, 0): "done", (0, 1): "done", (1, 0): "stale", (1, 1): "dead_letter", (1, 2): "skipped"}


def run(tmp_path, ends: dict, *, exit_status: int = 0):
    (tmp_path / "reconcile.jsonl").write_text("".join(
        json.dumps({"partition": p, "offset": o, "end": end}) + "\n" for (p, o), end in ends.items()))
    manifest = {"produced": PRODUCED, "reconcile": {"exit": exit_status, "export": "reconcile.jsonl",
                                                    "records": len(ends), "findings_total": 0}}
    findings = Findings()
    figures = check_agreement(manifest, tmp_path, lambda e: CHECKER[(e["partition"], e["offset"])], findings)
    return figures, findings


def test_the_same_verdicts_in_other_words_agree(tmp_path):
    figures, findings = run(tmp_path, {(0, 0): "done", (0, 1): "duplicate", (1, 0): "superseded",
                                       (1, 1): "dead_letter", (1, 2): "skipped"})
    assert findings.total == 0 and (figures["compared"], figures["agree"]) == (5, 5)


def test_a_record_judged_otherwise_or_not_read_or_unlisted_is_a_violation(tmp_path):
    figures, findings = run(tmp_path, {(0, 0): "unaccounted", (0, 1): "duplicate", (1, 0): "superseded",
                                       (1, 1): "dead_letter", (3, 9): "done"})
    assert findings.counts["reconcile_disagrees"] == 3 and figures["agree"] == 3
    lines = "\n".join(findings.problems)
    assert "[0]@0: the checker says done, the reconcile unaccounted" in lines
    assert "[1]@2: the checker says skipped, the reconcile nothing (not read)" in lines
    assert "[3]@9 (done), a record the manifest does not list" in lines


def test_a_reconcile_that_did_not_complete_is_a_violation_and_none_is_nothing_to_compare(tmp_path):
    _, findings = run(tmp_path, {}, exit_status=2)
    assert findings.counts["reconcile_disagrees"] == 1
    assert check_agreement({"produced": PRODUCED}, tmp_path, None, Findings()) is None
