"""The Prometheus alert rules of deploy/prometheus/ are valid, unit-tested, about real metrics, and each
links to its runbook in README.md.

promtool comes with Debian's ``prometheus`` package (``make test-tools`` installs it); without it
these tests fail rather than skip, so a missing tool never passes for green.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "rules.yml"
RULES_TEST = PROMETHEUS / "rules_test.yml"
CONFIG = PROMETHEUS / "prometheus.yml"
SEVERITIES = {"critical", "warning", "info"}


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool not found: install Debian's prometheus package: make test-tools")
    return subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, (f"{' '.join(result.args)} exited {result.returncode}\n"
                                    f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}")


def alerts() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_config_is_valid():
    # dns_sd_configs are not resolved by check config, so this needs no `worker` host.
    result = promtool("check", "config", str(CONFIG.relative_to(ROOT)))
    assert_ok(result)
    assert "SUCCESS" in result.stdout


def test_rules_are_valid():
    result = promtool("check", "rules", str(RULES.relative_to(ROOT)))
    assert_ok(result)
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_rules_pass_their_unit_tests():
    assert_ok(promtool("test", "rules", RULES_TEST.name, cwd=PROMETHEUS))


def test_every_alert_is_tested_firing_and_silent():
    tests = yaml.safe_load(RULES_TEST.read_text())
    assert tests["rule_files"] == [RULES.name]
    firing: set[str] = set()
    silent: set[str] = set()
    for test in tests["tests"]:
        for case in test.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else silent).add(case["alertname"])
    names = [rule["alert"] for rule in alerts()]
    assert len(names) == len(set(names)), "an alert name is used twice"
    assert sorted(set(names) - firing) == [], "alerts without a test where they fire"
    assert sorted(set(names) - silent) == [], "alerts without a test where they must stay silent"
    assert sorted((firing | silent) - set(names)) == [], "tests of alerts rules.yml does not have"


def test_every_alert_has_a_severity_and_says_what_to_look_at():
    for rule in alerts():
        assert rule.get("labels", {}).get("severity") in SEVERITIES, rule["alert"]
        annotations = rule.get("annotations", {})
        assert annotations.get("summary") and annotations.get("description"), rule["alert"]


def exported_names() -> set[str]:
    """Every series name the collectors of app/observability/metrics.py expose, with or without children yet."""
    from prometheus_client.metrics import MetricWrapperBase

    import app.observability.metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
    names: set[str] = set()
    for collector in vars(app.observability.metrics).values():
        if not isinstance(collector, MetricWrapperBase):
            continue
        for family in collector.collect():      # a Counter "order_x_total" is the family "order_x"
            names.add(family.name)
            names.update(family.name + suffix for suffix in suffixes.get(family.type, ()))
            names.update(sample.name for sample in family.samples)
    return names


def test_rules_use_only_metrics_the_app_exports():
    used = set(re.findall(r"order_[a-z_]+", RULES.read_text()))
    assert used, "no order_ metric found in rules.yml"
    assert sorted(used - exported_names()) == [], "rules.yml names metrics app/observability/metrics.py does not define"


README = ROOT / "README.md"


def github_anchor(heading: str, seen: dict[str, int]) -> str:
    """The id GitHub gives a Markdown heading: its text lower-cased, every character but letters,
    digits, ``_``, ``-`` and spaces removed, spaces made ``-``; a repeat gets ``-1``, ``-2``..."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)          # a link counts by its text
    slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    return slug if count == 0 else f"{slug}-{count}"


def readme_headings() -> list[tuple[int, str, str, list[str]]]:
    """(level, text, anchor, body lines) of every heading of README.md outside code blocks."""
    headings: list[tuple[int, str, str, list[str]]] = []
    seen: dict[str, int] = {}
    fenced = False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"^(#{1,6}) (.+?)\s*#*\s*$", line)
        if match:
            headings.append((len(match.group(1)), match.group(2), github_anchor(match.group(2), seen), []))
        elif headings:
            headings[-1][3].append(line)
    return headings


def runbooks() -> dict[str, tuple[str, list[str]]]:
    """The #### sections under "### Runbooks": heading text -> (anchor, body lines)."""
    found, inside = {}, False
    for level, text, anchor, body in readme_headings():
        if level <= 3:
            inside = (level, text) == (3, "Runbooks")
        elif inside and level == 4:
            found[text] = (anchor, body)
    return found


def test_github_anchors_are_computed_as_github_does():
    seen: dict[str, int] = {}
    assert github_anchor("After a failover or a restore", seen) == "after-a-failover-or-a-restore"
    assert github_anchor("The `t_idem` state machine", seen) == "the-t_idem-state-machine"
    assert github_anchor("Cost as `t_idem` grows", seen) == "cost-as-t_idem-grows"
    assert github_anchor("Measured", seen) == "measured" and github_anchor("Measured", seen) == "measured-1"


def test_every_alert_links_to_a_runbook_section_of_the_readme():
    anchors = {anchor for _, _, anchor, _ in readme_headings()}
    books = runbooks()
    for rule in alerts():
        url = rule.get("annotations", {}).get("runbook_url", "")
        assert url.startswith("README.md#"), (rule["alert"], url)
        anchor = url.split("#", 1)[1]
        assert anchor in anchors, f"{rule['alert']}: README.md has no heading with the anchor #{anchor}"
        assert books.get(rule["alert"], ("",))[0] == anchor, f"{rule['alert']}: its runbook_url is not its runbook"


def test_every_runbook_names_its_alert_and_says_what_to_do():
    names = {rule["alert"] for rule in alerts()}
    books = runbooks()
    assert sorted(set(books) - names) == [], "runbooks of alerts rules.yml does not have"
    assert sorted(names - set(books)) == [], "alerts without a runbook"
    for name, (_, body) in books.items():
        steps = [line for line in body if re.match(r"^\d+\. ", line)]
        assert len(steps) >= 2, f"runbook {name} has no steps (a numbered list)"
        assert [int(s.split(".")[0]) for s in steps] == list(range(1, len(steps) + 1)), name
