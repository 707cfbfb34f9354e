"""A provider added from outside the product (``harness/added_provider.py``: an effect on
ORDER_PAID, the provider that serves it, its fake; nothing else touched) goes through the short
chaos storm like the shipped ones: installed in every process of the run (``--preload``), the
workers call it, the storm faults it (its random faults, the 503 window), and the checker holds it
to its contract (at most one effect per order, one under its step's token for a done step) with
everything else it checks. The seed is random unless ``CHAOS_SEED`` names one."""

from __future__ import annotations

import json
import os
import secrets

from harness.chaos.driver import run
from harness.services import ROOT


def test_a_provider_added_in_a_module_of_its_own_is_faulted_by_the_storm_and_judged_by_the_checker():
    seed = int(os.environ.get("CHAOS_SEED") or secrets.randbelow(10**6))
    outcome = run("short", seed, preload=("harness.added_provider",))
    where = f"seed {seed}; manifest {outcome.manifest.relative_to(ROOT)}"
    assert outcome.drain_error is None, f"{outcome.drain_error} ({where})"
    assert not outcome.unexpected_exits, f"workers exited without the test's doing ({where})"
    report = outcome.report
    assert report.ok, "the checker found problems ({}):\n{}".format(where, "\n".join(map(str, report.problems)))
    assert report.lost == report.duplicate_effects == report.missing_effects == report.unchecked_effects == 0
    manifest = json.loads(outcome.manifest.read_text())
    # The checker was told of it, and held it to its contract: every points effect it counted.
    [points] = [d for d in manifest["effect_steps"] if d["effect"] == "points"]
    assert (points["provider"], points["contract"], points["services"]) == ("loyalty", "replays", ["loyalty"])
    assert report.effects.get("points", 0) > 100 and report.effects.get("loyalty_calls", 0) >= report.effects["points"]
    # The workers' clients called it (their own count, as last scraped: a killed worker's last second
    # is not in it), and the storm faulted it like the others.
    calls = manifest["metrics"]["effect_calls"]
    assert sum(n for labels, n in calls.items() if labels.startswith("points:ok")) > 0, calls
    injected = report.injected.get("loyalty", {})
    assert injected.get("fail", 0) > 0 and injected.get("reset", 0) > 0 and injected.get("timeout", 0) > 0, injected
    assert any(f["kind"] == "api_503_on" and "loyalty" in (f["detail"] or "") for f in manifest["faults"])
