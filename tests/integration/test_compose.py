"""docker-compose.yml is valid (checked with Debian's docker-compose v1, no engine needed)."""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.support.services import ROOT


def rendered() -> dict:
    out = subprocess.run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"], cwd=ROOT,
                         check=True, capture_output=True, text=True)
    return yaml.safe_load(out.stdout)


def test_compose_file_is_valid_and_complete():
    config = rendered()
    services = config["services"]
    assert set(services) == {"kafka", "mysql", "fakes", "migrate", "worker"}
    kafka_version = re.search(r"<kafka.version>([^<]+)<", (ROOT / "ops/kafka/pom.xml").read_text()).group(1)
    assert services["kafka"]["image"] == f"apache/kafka:{kafka_version}", "compose and local Kafka differ"
    assert services["mysql"]["image"] == "mysql:8.0"
    assert services["worker"]["scale"] == 2
    assert services["worker"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    for name in ("kafka", "mysql", "worker", "fakes"):
        assert "healthcheck" in services[name], f"{name} has no healthcheck"
    assert "alembic upgrade head" in " ".join(services["migrate"]["command"])
