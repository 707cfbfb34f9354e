"""The Prometheus alert rules of deploy/prometheus/ are valid, unit-tested, about real metrics, and each
links to its runbook, a page of the documentation site (docs/runbooks/<alert>.md).

promtool comes with Debian's ``prometheus`` package (``make test-tools`` installs it); without it
these tests fail rather than skip, so a missing tool never passes for green.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
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


DOCS = ROOT / "docs"
RUNBOOKS = DOCS / "runbooks"


def site_url() -> str:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())["site_url"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site, built strictly (a broken link or anchor fails the build)."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                            "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout}\n{built.stderr}"
    return out


def runbook_pages() -> dict[str, list[str]]:
    """docs/runbooks/<Alert>.md: alert name -> the page's lines (the runbooks' index aside)."""
    return {page.stem: page.read_text().splitlines() for page in sorted(RUNBOOKS.glob("*.md"))
            if page.name != "index.md"}


def test_the_documentation_site_builds_strictly(site: Path):
    assert (site / "index.html").is_file()
    assert (site / "runbooks" / "index.html").is_file()


def test_every_alert_links_to_its_runbook_page_on_the_site(site: Path):
    base = site_url()
    assert base.startswith("https://") and base.endswith("/"), base
    for rule in alerts():
        url = rule.get("annotations", {}).get("runbook_url", "")
        assert url == f"{base}runbooks/{rule['alert']}/", (rule["alert"], url)
        page = site / url.removeprefix(base) / "index.html"
        assert page.is_file(), f"{rule['alert']}: the built site has no page {url}"


def test_every_runbook_page_belongs_to_an_alert_and_says_what_to_do():
    names = {rule["alert"] for rule in alerts()}
    books = runbook_pages()
    assert sorted(set(books) - names) == [], "runbook pages of alerts rules.yml does not have"
    assert sorted(names - set(books)) == [], "alerts without a runbook page"
    for name, lines in books.items():
        assert lines[0] == f"# {name}", f"runbook {name}: its page's title is not its alert's name"
        steps = [line for line in lines if re.match(r"^\d+\. ", line)]
        assert len(steps) >= 2, f"runbook {name} has no steps (a numbered list)"
        assert [int(s.split(".")[0]) for s in steps] == list(range(1, len(steps) + 1)), name


def test_the_runbook_urls_in_the_rules_tests_are_the_rules_own():
    urls = {rule["alert"]: rule["annotations"]["runbook_url"] for rule in alerts()}
    tests = yaml.safe_load(RULES_TEST.read_text())
    for test in tests["tests"]:
        for case in test.get("alert_rule_test", []):
            for alert in case.get("exp_alerts") or []:
                assert alert["exp_annotations"]["runbook_url"] == urls[case["alertname"]], case["alertname"]
