"""The checker and the product's reconcile agree on the run, record by record.

The driver runs ``faust -A app reconcile`` over the whole run after the drain (the manifest's
``reconcile``: its exit status, figures, and the file next to the manifest where it exported every
record's end). Two programs judge the same records from the same tables, written apart (the
checker imports nothing of ``app``), so any record they judge differently is a defect of one of
them: a ``reconcile_disagrees`` violation naming the record and both verdicts.

The reconcile's ends, in the checker's words:

    done, duplicate     done        (a duplicate is done by its original's rows)
    superseded          stale
    dead_letter         dead_letter
    skipped             skipped
    anything else       lost        (its findings, and a record still in progress or unread after
                                     the drain, which the checker counts lost too)
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from harness.chaos.accounting import Findings

AS_CHECKER = {"done": "done", "duplicate": "done", "superseded": "stale", "dead_letter": "dead_letter",
              "skipped": "skipped"}


def check_agreement(manifest: dict, folder: Path, category, findings: Findings) -> dict | None:
    """The figures of the comparison (None when the run has no reconcile); each disagreement to
    ``findings``. ``category(entry)``: the checker's verdict on a record, None without the tables."""
    ran = manifest.get("reconcile")
    if not ran:
        return None
    figures = {"exit": ran.get("exit"), "records": ran.get("records"), "findings": ran.get("findings_total"),
               "seconds": ran.get("seconds"), "compared": 0, "agree": 0, "pairs": Counter()}
    if ran.get("exit") not in (0, 1) or not ran.get("export"):
        findings.flag("reconcile_disagrees", f"the reconcile did not complete (exit {ran.get('exit')}): "
                                             f"{ran.get('error') or ran.get('stderr') or 'no export'}")
        return _plain(figures)
    ends: dict[tuple[int, int], str] = {}
    with open(folder / ran["export"], encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            ends[(row["partition"], row["offset"])] = row["end"]
    if category is None:
        return _plain(figures)
    listed = set()
    for entry in manifest["produced"]:
        coords = (entry["partition"], entry["offset"])
        listed.add(coords)
        ours = category(entry)
        end = ends.get(coords)
        theirs = AS_CHECKER.get(end, "lost") if end is not None else None
        figures["compared"] += 1
        figures["pairs"][f"{ours}/{end}"] += 1
        if theirs == ours:
            figures["agree"] += 1
            continue
        findings.flag("reconcile_disagrees", f"{entry['kind']} {entry.get('type') or entry.get('malformed_kind')} of "
                                             f"{entry.get('order_no')} at [{coords[0]}]@{coords[1]}: the checker says "
                                             f"{ours}, the reconcile {end or 'nothing (not read)'}")
    for coords in sorted(set(ends) - listed):
        findings.flag("reconcile_disagrees", f"the reconcile judged [{coords[0]}]@{coords[1]} ({ends[coords]}), "
                                             "a record the manifest does not list")
    return _plain(figures)


def _plain(figures: dict) -> dict:
    return {**figures, "pairs": dict(figures["pairs"])}
