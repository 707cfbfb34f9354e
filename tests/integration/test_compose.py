"""docker-compose.yml is valid (checked with Debian's docker-compose v1, no engine needed)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import yaml

from harness.services import ROOT


def rendered() -> dict:
    out = subprocess.run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"], cwd=ROOT,
                         check=True, capture_output=True, text=True)
    return yaml.safe_load(out.stdout)


def test_compose_file_is_valid_and_complete():
    config = rendered()
    services = config["services"]
    assert set(services) == {"kafka", "mysql", "fakes", "migrate", "worker", "prometheus", "alertmanager", "grafana"}
    kafka_version = re.search(r"<kafka.version>([^<]+)<", (ROOT / "ops/kafka/pom.xml").read_text()).group(1)
    assert services["kafka"]["image"] == f"apache/kafka:{kafka_version}", "compose and local Kafka differ"
    assert services["mysql"]["image"] == "mysql:8.0"
    assert services["worker"]["scale"] == 2
    assert services["worker"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    for name in ("kafka", "mysql", "worker", "fakes"):
        assert "healthcheck" in services[name], f"{name} has no healthcheck"
    assert "python -m app.admin migrate" in " ".join(services["migrate"]["command"])


def stages() -> dict[str, list[str]]:
    """The Dockerfile's stages, by name: each stage's lines (the last is what ``build: .`` builds)."""
    found: dict[str, list[str]] = {}
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if match := re.match(r"FROM \S+ AS (\S+)", line):
            found[match[1]] = lines = [line]
        elif found and line.strip() and not line.startswith("#"):
            lines.append(line)
    return found


def test_the_fakes_run_from_an_image_that_holds_them_and_the_workers_from_one_that_does_not():
    services, built = rendered()["services"], stages()
    fakes = services["fakes"]
    assert fakes["command"][:3] == ["python", "-m", "demo.fakes"]
    assert fakes["build"]["target"] == "fakes" and "COPY demo ./demo" in built["fakes"]
    assert list(built)[-1] == "worker"              # what build: . builds
    for name in ("worker", "migrate"):
        assert "target" not in services[name]["build"]
    assert not [line for stage in ("base", "worker") for line in built[stage] if "demo" in line]


def mounts_of(service: dict) -> dict[str, tuple[Path, list[str]]]:
    mounts = {}
    for volume in service["volumes"]:
        if isinstance(volume, str):          # "source:target[:mode]"
            source, target, *mode = volume.split(":")
        else:
            source, target, mode = volume["source"], volume["target"], ["ro"] if volume.get("read_only") else []
        mounts[target] = (Path(source), mode)
    return mounts


def test_prometheus_scrapes_the_workers_with_the_rules():
    prometheus = rendered()["services"]["prometheus"]
    source, mode = mounts_of(prometheus)["/etc/prometheus"]
    assert source.resolve() == (ROOT / "deploy/prometheus").resolve(), "prometheus must mount deploy/prometheus"
    assert mode == ["ro"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert prometheus["depends_on"]["worker"]["condition"] == "service_started"

    config = yaml.safe_load((source / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"order-event-processor"}
    job = jobs["order-event-processor"]
    assert job["metrics_path"] == "/metrics"
    assert job["dns_sd_configs"] == [{"names": ["worker"], "type": "A", "port": 6066}]
    assert config["rule_files"] == ["rules.yml"] and (source / "rules.yml").is_file()


def test_prometheus_sends_its_alerts_to_the_alertmanager_service():
    services = rendered()["services"]
    alertmanager = services["alertmanager"]
    assert alertmanager["image"].startswith("prom/alertmanager:")
    source, mode = mounts_of(alertmanager)["/etc/alertmanager"]
    assert source.resolve() == (ROOT / "deploy/alertmanager").resolve() and mode == ["ro"]
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in alertmanager["command"]
    assert (source / "alertmanager.yml").is_file()
    assert services["prometheus"]["depends_on"]["alertmanager"]["condition"] == "service_started"

    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = [target for am in config["alerting"]["alertmanagers"] for static in am["static_configs"]
               for target in static["targets"]]
    assert targets == ["alertmanager:9093"]


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard():
    services = rendered()["services"]
    grafana = services["grafana"]
    assert grafana["image"].startswith("grafana/grafana:")
    mounts = mounts_of(grafana)
    provisioning, mode = mounts["/etc/grafana/provisioning"]
    assert provisioning.resolve() == (ROOT / "deploy/grafana/provisioning").resolve() and mode == ["ro"]
    dashboards = [target for target, (source, _) in mounts.items()
                  if source.resolve() == (ROOT / "deploy/grafana/dashboards").resolve()]
    assert len(dashboards) == 1

    sources = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())["datasources"]
    assert [(s["type"], s["url"], s["uid"]) for s in sources] == [("prometheus", "http://prometheus:9090", "prometheus")]
    assert "prometheus" in services and "9090" in services["prometheus"]["ports"][0]
    providers = yaml.safe_load((provisioning / "dashboards/order-event-processor.yml").read_text())["providers"]
    assert [p["options"]["path"] for p in providers] == dashboards
    assert (ROOT / "deploy/grafana/dashboards/order-event-processor.json").is_file()


def test_published_ports_are_on_this_machine_only():
    """The web views show phone numbers and addresses: compose publishes them on 127.0.0.1, not on
    every interface; the views' tokens come from the environment (empty: they answer 403)."""
    services = rendered()["services"]
    published = {name: [str(port) for port in service.get("ports", [])] for name, service in services.items()}
    assert published["worker"] and published["prometheus"] and published["alertmanager"] and published["grafana"]
    for name, ports in published.items():
        assert all(port.startswith("127.0.0.1:") for port in ports), (name, ports)
    assert {"WEB_TOKEN", "WEB_READ_TOKEN", "IDEM_TOKEN_SECRET"} <= set(services["worker"]["environment"])


def test_compose_does_not_start_without_a_token_secret():
    env = {k: v for k, v in os.environ.items() if k != "IDEM_TOKEN_SECRET"}
    out = subprocess.run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert out.returncode != 0 and "set IDEM_TOKEN_SECRET" in out.stderr
