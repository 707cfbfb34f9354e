"""The chart's numbers follow the worker's settings (change a setting in `config`: the worker's
environment and the manifest's number move together), and no secret's value can reach what the
chart renders: secrets are references, and a secret given as a setting is refused without being
repeated.
"""

from __future__ import annotations

import math
import re

import pytest
import yaml

from app.settings import Settings
from app.settings._base import env_name
from app.settings.reference import _secret, fields
from harness.helm import CHART, PRODUCTION, find, objects, render, template

STOP_SETTINGS = ("BROKER_SESSION_TIMEOUT_SECONDS", "STOP_TIMEOUT_SECONDS", "WATCHDOG_STALL_SECONDS",
                 "WATCHDOG_REJOIN_GRACE_SECONDS", "INFRA_RETRY_BUDGET_SECONDS", "KAFKA_STARTUP_WAIT_SECONDS",
                 "KAFKA_REVOKE_GRACE_SECONDS")
MARGIN = yaml.safe_load((CHART / "values.yaml").read_text())["probes"]["graceMarginSeconds"]


@pytest.fixture
def worker_settings(monkeypatch):
    """The worker's Settings under a chart's `config`, as its pod's environment would give them."""
    def read(config: dict[str, str]) -> Settings:
        for name in STOP_SETTINGS:
            monkeypatch.delenv(name, raising=False)
        for name, value in config.items():
            monkeypatch.setenv(name, value)
        return Settings()
    return read


def worker(manifests: str) -> dict:
    return find(manifests, "Deployment")[0]["spec"]


def rendered_with(config: dict[str, str], **values) -> str:
    return render(values={**{f"config.{k}": v for k, v in config.items()}, **values})


def refusal(**values) -> str:
    out = template(values=values)
    assert out.returncode != 0, "helm rendered what the chart must refuse"
    return out.stderr


def test_the_charts_defaults_are_the_workers():
    from app.web.health import READINESS_CHECK_SECONDS
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    block = re.search(r'define "oep.productDefaults" -}}\n(.*?)\{\{- end', helpers, re.S)
    assert block, "the productDefaults block moved: this test must follow it"
    chart = yaml.safe_load(block.group(1))
    product = {env_name(field): field.default for _, field in fields()}
    product["READINESS_CHECK_SECONDS"] = READINESS_CHECK_SECONDS
    for name, value in chart.items():
        expected = product[name]
        if isinstance(expected, (int, float)):
            assert float(value) == float(expected), f"{name}: the chart assumes {value}, the worker's default is {expected}"
        else:
            assert value == expected, f"{name}: the chart assumes {value!r}, the worker's default is {expected!r}"


@pytest.mark.parametrize("config", [{}, {"STOP_TIMEOUT_SECONDS": "90"}, {"BROKER_SESSION_TIMEOUT_SECONDS": "45"},
                                    {"BROKER_SESSION_TIMEOUT_SECONDS": "45", "STOP_TIMEOUT_SECONDS": "20.5"}])
def test_the_grace_period_outlasts_the_workers_own_stop_bound(config, worker_settings):
    stop = worker_settings(config).kafka.stop_timeout
    grace = worker(rendered_with(config))["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == math.ceil(stop) + MARGIN
    assert grace > stop


@pytest.mark.parametrize("config", [{}, {"INFRA_RETRY_BUDGET_SECONDS": "120"}, {"BROKER_SESSION_TIMEOUT_SECONDS": "120"},
                                    {"KAFKA_STARTUP_WAIT_SECONDS": "30", "WATCHDOG_STALL_SECONDS": "90"}])
def test_the_probes_outlast_what_the_worker_waits_out_by_design(config, worker_settings):
    from app.web.health import READINESS_CHECK_SECONDS
    s = worker_settings(config)
    container = worker(rendered_with(config))["template"]["spec"]["containers"][0]
    live, start, ready = container["livenessProbe"], container["startupProbe"], container["readinessProbe"]
    assert live["httpGet"]["path"] == start["httpGet"]["path"] == "/health" and ready["httpGet"]["path"] == "/readyz"
    # A restart only after longer than the database's budget and the watchdog's own exit.
    rides_out = max(s.database.infra_retry_budget_seconds, s.kafka.watchdog_stall + s.kafka.watchdog_rejoin_grace)
    assert live["periodSeconds"] * (live["failureThreshold"] - 1) >= rides_out
    # /health answers once the start-up checks are done: the broker, the topics, the database waited for.
    assert start["periodSeconds"] * (start["failureThreshold"] - 1) >= (
        2 * s.kafka.startup_wait_seconds + s.database.infra_retry_budget_seconds)
    assert ready["timeoutSeconds"] > 2 * READINESS_CHECK_SECONDS


@pytest.mark.parametrize("partitions", ["3", "8", "24"])
def test_the_replica_cap_follows_the_partitions(partitions):
    cap = int(partitions)
    keda = find(rendered_with({"ORDER_EVENT_PARTITIONS": partitions}, **{"autoscaling.keda.enabled": True}), "ScaledObject")
    hpa = find(rendered_with({"ORDER_EVENT_PARTITIONS": partitions}, **{"autoscaling.hpa.enabled": True}),
               "HorizontalPodAutoscaler")
    assert keda[0]["spec"]["maxReplicaCount"] == cap and hpa[0]["spec"]["maxReplicas"] == cap
    # At the cap a rollout stops a worker before it starts one (a surge worker would get no partition).
    at_cap = worker(rendered_with({"ORDER_EVENT_PARTITIONS": partitions}, replicaCount=cap))["strategy"]
    assert at_cap["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    if cap > 2:
        below = worker(rendered_with({"ORDER_EVENT_PARTITIONS": partitions}, replicaCount=2))["strategy"]
        assert below["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_more_workers_than_partitions_are_refused():
    assert "replicaCount 4 is more than ORDER_EVENT_PARTITIONS 3" in refusal(
        **{"config.ORDER_EVENT_PARTITIONS": "3", "replicaCount": 4})
    assert "autoscaling.maxReplicas 5 is more than ORDER_EVENT_PARTITIONS 3" in refusal(
        **{"config.ORDER_EVENT_PARTITIONS": "3", "autoscaling.maxReplicas": 5, "autoscaling.keda.enabled": True})
    assert "autoscaling.minReplicas must be at least 1" in refusal(
        **{"autoscaling.minReplicas": 0, "autoscaling.keda.enabled": True})


@pytest.mark.parametrize("config", [{}, {"KAFKA_REVOKE_GRACE_SECONDS": "20", "STOP_TIMEOUT_SECONDS": "60"}])
def test_the_autoscaler_paces_itself_by_a_rebalance(config, worker_settings):
    s = worker_settings(config)
    spec = find(rendered_with(config, **{"autoscaling.keda.enabled": True}), "ScaledObject")[0]["spec"]
    rebalance = s.kafka.stop_timeout + s.kafka.session_timeout_seconds + s.kafka.revoke_grace_seconds
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": math.ceil(rebalance)}]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 2 * rebalance
    assert spec["cooldownPeriod"] >= rebalance and spec["minReplicaCount"] >= 1
    per_worker = yaml.safe_load((CHART / "values.yaml").read_text())["autoscaling"]["eventsPerSecondPerWorker"]
    lag = spec["triggers"][0]["metadata"]["lagThreshold"]
    assert int(lag) == per_worker * 3 * math.ceil(s.kafka.revoke_grace_seconds)


@pytest.mark.parametrize("config", [{}, {"MAX_BATCH_BYTES": "134217728"}, {"BREAKER_HOLD_RECORDS": "50000"},
                                    {"BREAKER_HOLD_RECORDS": "0", "MAX_BATCH_BYTES": "16777216"}])
def test_the_memory_limit_holds_one_hostile_batch_and_the_records_a_hold_keeps(config, worker_settings):
    s = worker_settings(config)
    per_record_kib = yaml.safe_load((CHART / "values.yaml").read_text())["resources"]["heldRecordKiB"]
    resources = worker(rendered_with(config))["template"]["spec"]["containers"][0]["resources"]
    request, limit = (int(resources[k]["memory"].removesuffix("Mi")) for k in ("requests", "limits"))
    held_mib = math.ceil(s.effects.breaker_hold_records * per_record_kib / 1024)
    assert limit - request == math.ceil(s.batches.max_batch_bytes / 2**20) + held_mib


def secret_settings() -> list[str]:
    """Every setting the worker keeps secret, and MYSQL_URL, which holds the database's password."""
    names = [env_name(field).replace("<EFFECT>", "WAYBILL") for _, field in fields() if _secret(field.annotation)]
    assert {"IDEM_TOKEN_SECRET", "KAFKA_SASL_PASSWORD", "WEB_TOKEN", "WEB_READ_TOKEN"} <= set(names)
    return [*names, "MYSQL_URL"]


@pytest.mark.parametrize("name", secret_settings())
def test_a_secret_given_as_a_setting_is_refused_without_being_repeated(name):
    value = f"s3cr3t-{name.lower()}-Zq9"
    for key in (name, name.lower()):
        message = refusal(**{f"config.{key}": value})
        assert f"config.{key} is a secret" in message and f"secretEnv.{key}" in message
        assert value not in message
    message = refusal(**{f"secretEnv.{name}": value})
    assert "never hold the value" in message and value not in message


def test_no_secret_value_reaches_a_configmap_or_an_env_value():
    references = {name: {"secret": f"vault-{i}-Zq9", "key": f"key-{i}-Zq9"} for i, name in enumerate(secret_settings())}
    values = {f"secretEnv.{name}.{part}": v for name, ref in references.items() for part, v in ref.items()}
    manifests = render(files=[PRODUCTION], values={**values, "webTokensFile.secret": "tokens-Zq9",
                                                   "webTokensFile.key": "tokens"})
    assert not find(manifests, "Secret"), "the chart makes no Secret: the operator's own are referenced"
    plain = []
    for doc in objects(manifests):
        if doc["kind"] == "ConfigMap":
            assert not set(doc["data"]) & set(references), f"a secret setting in ConfigMap {doc['metadata']['name']}"
            plain += list(doc["data"].values())
        for pod in pod_specs(doc):
            for container in pod["containers"]:
                for env in container.get("env", []):
                    if env["name"] in references:
                        ref = env["valueFrom"]["secretKeyRef"]
                        assert {"secret": ref["name"], "key": ref["key"]} == references[env["name"]]
                    else:
                        plain.append(env.get("value", ""))
    assert plain and not [v for v in plain if "Zq9" in v or re.search(r"://[^/@\s]+:[^/@\s]+@", v)]


def pod_specs(doc: dict) -> list[dict]:
    if doc["kind"] in ("Deployment", "Job"):
        return [doc["spec"]["template"]["spec"]]
    return []
