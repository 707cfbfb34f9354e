"""Helm and the manifest checker, for the chart's tests (tests/unit/test_helm_chart.py).

Both are built once from their Go modules by ``ops/services.sh`` (``make test-tools`` does it; a
test that finds one missing builds it, which takes minutes the first time) and cached in
``.cache/helm/``: Helm at ``HELM_VERSION``, the checker per version of its sources
(``deploy/helm/checker``). No cluster is involved: ``helm template`` renders offline and the checker
decodes what it rendered into the upstream API types.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "order-event-processor"
PRODUCTION = CHART / "values-production.yaml"
HELM_VERSION = os.environ.get("HELM_VERSION", "4.3.2")
SERVICES = ["bash", str(ROOT / "ops" / "services.sh")]


def _cache() -> Path:
    return Path(os.environ.get("SERVICES_CACHE", ROOT / ".cache"))


def helm_program() -> Path:
    path = _cache() / "helm" / HELM_VERSION / "helm"
    if not path.exists():
        subprocess.run([*SERVICES, "helm"], check=True, timeout=1800)
    return path


@functools.cache
def checker_program() -> Path:
    """The checker of the sources as they are now (built if they changed)."""
    out = subprocess.run([*SERVICES, "k8s-checker"], check=True, timeout=1800, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def helm(*args: str, chart: Path = CHART) -> subprocess.CompletedProcess:
    return subprocess.run([str(helm_program()), *args], cwd=chart, capture_output=True, text=True, timeout=120)


def set_flags(values: Mapping[str, object]) -> list[str]:
    """``--set-string`` for strings (a setting stays text), ``--set`` for the rest."""
    flags = []
    for key, value in values.items():
        if isinstance(value, str):
            flags += ["--set-string", f"{key}={value}"]
        else:
            flags += ["--set", f"{key}={'true' if value is True else 'false' if value is False else value}"]
    return flags


def template(*, files: Iterable[Path] = (), values: Mapping[str, object] | None = None, namespace: str = "orders",
             chart: Path = CHART) -> subprocess.CompletedProcess:
    args = ["template", "oep", ".", "--namespace", namespace]
    for f in files:
        args += ["-f", str(f)]
    return helm(*args, *set_flags(values or {}), chart=chart)


def render(**kwargs) -> str:
    """The manifests ``helm template`` renders; AssertionError with Helm's own words if it refuses."""
    out = template(**kwargs)
    assert out.returncode == 0, f"helm template failed:\n{out.stderr}"
    return out.stdout


def objects(manifests: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(manifests) if doc]


def find(manifests: str, kind: str) -> list[dict]:
    return [doc for doc in objects(manifests) if doc["kind"] == kind]


def check(manifests: str, *, external: Iterable[str] = ()) -> subprocess.CompletedProcess:
    args = [str(checker_program())]
    for name in external:
        args += ["-external", name]
    return subprocess.run(args, input=manifests, capture_output=True, text=True, timeout=120)
