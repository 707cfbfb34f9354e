"""deploy/alertmanager/alertmanager.yml is valid and routes each alert of rules.yml by its severity.

amtool comes with Debian's ``prometheus-alertmanager`` package (``make test-tools`` installs it);
without it these tests fail rather than skip, so a missing tool never passes for green.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RECEIVER_OF = {"critical": "pager", "warning": "chat", "info": "tickets"}


def amtool(*args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("amtool")
    if tool is None:
        pytest.fail("amtool not found: install Debian's prometheus-alertmanager package: make test-tools")
    return subprocess.run([tool, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def routed(**labels: str) -> list[str]:
    """The receivers an alert with these labels reaches, as amtool resolves them from the config."""
    result = amtool("config", "routes", "test", f"--config.file={CONFIG}", *(f"{k}={v}" for k, v in labels.items()))
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_config_is_valid():
    result = amtool("check-config", str(CONFIG))
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "SUCCESS" in result.stdout and "3 receivers" in result.stdout


@pytest.mark.parametrize("severity", sorted(RECEIVER_OF))
def test_a_severity_reaches_its_receiver(severity):
    assert routed(alertname="Example", severity=severity) == [RECEIVER_OF[severity]]


def test_every_alert_rule_reaches_the_receiver_of_its_severity():
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert {rule["labels"]["severity"] for rule in rules} == set(RECEIVER_OF)
    for rule in rules:
        severity = rule["labels"]["severity"]
        assert routed(alertname=rule["alert"], severity=severity) == [RECEIVER_OF[severity]], rule["alert"]


def test_an_alert_without_a_known_severity_is_not_dropped():
    assert routed(alertname="Example") == ["chat"]
    assert routed(alertname="Example", severity="page-me") == ["chat"]


def test_no_receiver_url_is_a_real_address():
    """The committed receivers are placeholders (.invalid never resolves): a real webhook URL, often
    with a token in it, belongs in the deployment's own copy."""
    receivers = yaml.safe_load(CONFIG.read_text())["receivers"]
    urls = [hook["url"] for receiver in receivers for hook in receiver.get("webhook_configs", [])]
    assert len(urls) == len(receivers) == 3
    assert all(url.split("/")[2].endswith(".invalid") for url in urls), urls
