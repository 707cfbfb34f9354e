"""The Helm chart (deploy/helm/order-event-processor) lints strictly, renders for its default values
and for the production example, and every object it renders decodes strictly into the upstream API
types (k8s.io/api, the Prometheus operator's, KEDA's) with its references between objects whole:
the checker in deploy/helm/checker. Its alert rules and dashboard are the repository's own files.

Helm and the checker are built once from their Go modules (``ops/services.sh helm`` and
``k8s-checker``, run by ``make test-tools``); no cluster is needed.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from harness.helm import CHART, PRODUCTION, ROOT, check, find, helm, objects, render

VALUES_FILES = {"default": [], "production": [PRODUCTION]}


def externals(files) -> list[str]:
    """The ConfigMaps a values file names that the operator makes (CA bundles), for the checker."""
    names = []
    for f in files:
        values = yaml.safe_load(f.read_text())
        names += [f"ConfigMap/{m['configMap']}" for m in values.get("fileMounts", []) if "configMap" in m]
        if ca := values.get("autoscaling", {}).get("kafkaCA", {}).get("configMap"):
            names.append(f"ConfigMap/{ca}")
    return names


def assert_checked(manifests: str, *, external=()) -> None:
    out = check(manifests, external=external)
    rendered = len(objects(manifests))
    assert out.returncode == 0, f"the checker refused the manifests:\n{out.stdout}{out.stderr}"
    assert f"{rendered} objects, 0 problems" in out.stdout, out.stdout


@pytest.mark.parametrize("name", VALUES_FILES)
def test_the_chart_lints_strictly(name):
    args = ["lint", "--strict", "."]
    for f in VALUES_FILES[name]:
        args += ["-f", str(f)]
    out = helm(*args)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("name, values", [
    ("default", {}),
    ("default", {"autoscaling.keda.enabled": True}),
    ("default", {"autoscaling.hpa.enabled": True}),
    ("default", {"config.KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "autoscaling.keda.enabled": True,
                 "config.KAFKA_SASL_USERNAME": "orders", "secretEnv.KAFKA_SASL_PASSWORD.key": "kafka-password"}),
    ("production", {}),
])
def test_every_rendered_object_decodes_strictly_into_its_upstream_type(name, values):
    files = VALUES_FILES[name]
    manifests = render(files=files, values=values)
    assert_checked(manifests, external=externals(files))


def test_the_production_example_renders_what_it_promises():
    manifests = render(files=[PRODUCTION])
    kinds = sorted(doc["kind"] for doc in objects(manifests))
    assert kinds == sorted(["ConfigMap", "ConfigMap", "Deployment", "Job", "NetworkPolicy", "PodDisruptionBudget",
                            "PrometheusRule", "ScaledObject", "Service", "ServiceAccount", "ServiceMonitor",
                            "TriggerAuthentication"])
    config = find(manifests, "ConfigMap")[0]["data"]
    assert config["KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL" and config["MYSQL_SSL_MODE"] == "verify"
    scaled = find(manifests, "ScaledObject")[0]["spec"]
    assert scaled["minReplicaCount"] == 3 and scaled["maxReplicaCount"] == 24
    kafka = scaled["triggers"][0]["metadata"]
    assert kafka["sasl"] == "scram_sha512" and kafka["tls"] == "enable"
    assert kafka["bootstrapServers"] == ("b-1.orders-kafka.example.com:9096,b-2.orders-kafka.example.com:9096,"
                                         "b-3.orders-kafka.example.com:9096")
    auth = find(manifests, "TriggerAuthentication")[0]["spec"]
    assert {r["parameter"] for r in auth["secretTargetRef"]} == {"username", "password"}
    assert [r["parameter"] for r in auth["configMapTargetRef"]] == ["ca"]


def test_the_prometheus_rule_is_the_repositorys_rules_file():
    manifests = render()
    rule = find(manifests, "PrometheusRule")[0]
    assert rule["spec"]["groups"] == yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yml").read_text())["groups"]
    link = CHART / "files" / "rules.yml"
    assert link.is_symlink() and link.resolve() == (ROOT / "deploy" / "prometheus" / "rules.yml").resolve()


def test_the_scrape_job_is_the_one_the_alert_rules_select():
    rules = (ROOT / "deploy" / "prometheus" / "rules.yml").read_text()
    jobs = set(re.findall(r'job="([^"]+)"', rules))
    assert jobs, "the rules select no job any more: this test must follow them"
    manifests = render()
    monitor = find(manifests, "ServiceMonitor")[0]["spec"]
    service = find(manifests, "Service")[0]["metadata"]["labels"]
    assert {service[monitor["jobLabel"]]} == jobs
    hold = find(render(values={"autoscaling.keda.enabled": True}), "ScaledObject")[0]["spec"]["triggers"][1]
    assert all(f'job="{job}"' in hold["metadata"]["query"] for job in jobs)


def test_the_dashboard_is_the_generated_one_for_grafanas_sidecar():
    manifests = render()
    board = next(cm for cm in find(manifests, "ConfigMap") if cm["metadata"]["name"].endswith("-dashboard"))
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    generated = ROOT / "deploy" / "grafana" / "dashboards" / "order-event-processor.json"
    assert json.loads(board["data"]["order-event-processor.json"]) == json.loads(generated.read_text())


def test_the_migration_runs_before_the_workers_and_a_failed_one_stops_the_upgrade():
    manifests = render()
    job = find(manifests, "Job")[0]
    hooks = job["metadata"]["annotations"]
    assert set(hooks["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    # A failed migration's Job stays for its log; the upgrade fails before the Deployment changes.
    assert "hook-failed" not in hooks["helm.sh/hook-delete-policy"]
    assert job["spec"]["backoffLimit"] == 0
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "app.admin", "migrate"]
    worker = find(manifests, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == worker["image"]
    # It reads no object of the chart's (none exists yet at pre-install): the checker refuses that.
    assert "envFrom" not in container and "serviceAccountName" not in job["spec"]["template"]["spec"]


def test_the_image_is_this_release():
    from app.version import VERSION
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION, "set Chart.yaml's appVersion with app/version.py"


def test_the_checker_refuses_what_the_api_server_would(tmp_path):
    """The checker can fail: an unknown field, a field in the wrong case, a duplicate key, an
    unknown kind, a scaler's misspelt parameter, a pre-install hook reading the chart's ConfigMap."""
    manifests = render(values={"autoscaling.keda.enabled": True})
    broken = {
        "unknown field": manifests.replace("  minReadySeconds:", "  minReadySecond:"),
        "wrong case": manifests.replace("      terminationGracePeriodSeconds:", "      TerminationGracePeriodSeconds:"),
        "duplicate key": manifests.replace("  minReadySeconds: 15\n", "  minReadySeconds: 15\n  minReadySeconds: 16\n"),
        "unknown kind": manifests + "---\napiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n",
        "misspelt trigger parameter": manifests.replace("lagThreshold:", "lagTreshold:"),
        "hook reads the chart's ConfigMap": manifests.replace(
            "          command: [\"python\", \"-m\", \"app.admin\", \"migrate\"]",
            "          command: [\"python\", \"-m\", \"app.admin\", \"migrate\"]\n"
            "          envFrom: [{configMapRef: {name: oep-order-event-processor}}]"),
    }
    expected = {
        "unknown field": 'unknown field "spec.minReadySecond"',
        "wrong case": 'unknown field "spec.template.spec.TerminationGracePeriodSeconds"',
        "duplicate key": 'key "minReadySeconds" already set in map',
        "unknown kind": "a kind this checker does not know",
        "misspelt trigger parameter": 'metadata "lagTreshold" is no parameter of the kafka scaler',
        "hook reads the chart's ConfigMap": "which a pre-install hook runs before",
    }
    for what, text in broken.items():
        assert text != manifests, f"{what}: the test's edit found nothing to change"
        out = check(text)
        assert out.returncode == 1, f"{what}: the checker let it pass:\n{out.stdout}"
        assert expected[what] in out.stdout, f"{what}:\n{out.stdout}"


def test_a_misspelt_value_is_refused_not_ignored():
    out = helm("template", "oep", ".", "--set", "autoscaling.keda.enable=true")
    assert out.returncode != 0 and "additional properties 'enable' not allowed" in out.stderr


def test_the_packaged_chart_carries_the_linked_files_themselves(tmp_path):
    out = helm("package", str(CHART), "--destination", str(tmp_path))
    assert out.returncode == 0, out.stderr
    [archive] = tmp_path.glob("order-event-processor-*.tgz")
    rendered = helm("template", "oep", str(archive), chart=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    rule = find(rendered.stdout, "PrometheusRule")[0]
    assert rule["spec"]["groups"] == yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yml").read_text())["groups"]
