"""A rolling upgrade under load, and its rollback: the previous release (``ops/releases.toml``,
built from its commit by ``harness.releases``) and the current code in one consumer group.

Its own Kafka broker and MariaDB (never the shared ones), the fake APIs failing at random (5xx,
lost replies, hangs), two workers of the previous release on a database its own migrations
brought to its head, a few hundred orders flowing all along (created, paid, confirmed or
cancelled: waybills and SMS). Mid-run the current code's migrations run to head while the
previous release writes; then each worker is replaced by the current code, one at a time
(SIGTERM, its exit, the new one started, the group stable and consuming again); then each is
replaced by the previous release again, the new schema left in place. The input stops, the
run drains, and the chaos checker judges the whole run (nothing lost, no second effect, no
wrong state, nothing pending) and every replacement: its replay window (records the stopped
worker finished and did not commit: none after a SIGTERM) and how long the group took to
consume every partition again. ``make chaos MODE=upgrade`` is the long run: three workers and
the storm. The seed is random unless ``CHAOS_SEED`` names one.
"""

from __future__ import annotations

import json
import os
import secrets

from harness.chaos.driver import run
from harness.chaos.upgrade import current_head
from harness.releases import previous_release
from harness.services import ROOT


def test_a_rolling_upgrade_and_its_rollback_under_load_lose_nothing_replay_nothing_and_do_nothing_twice():
    seed = int(os.environ.get("CHAOS_SEED") or secrets.randbelow(10**6))
    previous = previous_release()
    outcome = run("upgrade-short", seed)
    where = f"seed {seed}; manifest {outcome.manifest.relative_to(ROOT)}"
    assert outcome.drain_error is None, f"{outcome.drain_error} ({where})"
    assert not outcome.unexpected_exits, \
        f"workers exited without the test's doing: {json.dumps(outcome.unexpected_exits)} ({where})"
    report = outcome.report
    assert report is not None, f"the checker gave no report ({where})"
    assert report.ok, "the checker found problems ({}):\n{}".format(where, "\n".join(map(str, report.problems)))
    assert report.acked["consumed"] == report.acked["records"] == report.events
    assert report.effects["waybills"] > 0 and report.effects["sms"] > 0

    upgrade = report.upgrade
    print(f"\nrolling upgrade ({where}): " + json.dumps(
        [{k: r.get(k) for k in ("kind", "stopped", "started", "replayed", "replayed_counter", "duplicates_in_span",
                                "stop_seconds", "stable_seconds", "rebalance_seconds")}
         for r in upgrade["replacements"]]))
    migration = upgrade["migration"]
    assert migration["from"] == upgrade["schema"]["previous_head"] and migration["to"] == current_head()
    if migration["from"] != migration["to"]:       # a release with migrations: applied under the previous one's workers
        assert set(migration["workers"].values()) == {previous.version}, "the migration ran under other workers"
    assert [(r["kind"], r["stopped_version"], r["started_version"]) for r in upgrade["replacements"]] == \
        [("upgrade", previous.version, "current")] * 2 + [("roll_back", "current", previous.version)] * 2
    for replacement in upgrade["replacements"]:
        assert replacement["returncode"] == 0 and replacement["replayed"] == 0, replacement
        assert replacement["rebalance_seconds"] >= replacement["stable_seconds"] > 0
    assert upgrade["schema"]["at_end"] == current_head()
    assert upgrade["previous_on_new_schema_seconds"] > 0
