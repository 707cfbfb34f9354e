"""A real Jaeger (v2, the all-in-one program built from its Go module by ``ops/services.sh jaeger``)
for the tracing test: in-memory storage, an OTLP/HTTP receiver and the query API on free ports of
127.0.0.1 (none of its default ports, which another Jaeger or a CI neighbour may hold)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from harness.services import LOGS, ROOT, free_port

VERSION = os.environ.get("JAEGER_VERSION", "1.75.0")

CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: []
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp_http}
      grpc:
        endpoint: 127.0.0.1:{otlp_grpc}
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


def program() -> Path:
    """The Jaeger program, built once (minutes on a fresh machine) and cached with the Kafka jars."""
    cache = Path(os.environ.get("SERVICES_CACHE", ROOT / ".cache"))
    path = cache / "jaeger" / VERSION / "jaeger"
    if not path.exists():
        subprocess.run(["bash", str(ROOT / "ops" / "services.sh"), "jaeger"], check=True, timeout=1800)
    return path


class Jaeger:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.query, self.otlp_http = free_port(), free_port()
        self.otlp_grpc = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.config = folder / "jaeger.yaml"
        self.config.write_text(CONFIG.format(query=self.query, query_grpc=free_port(), otlp_http=self.otlp_http,
                                             otlp_grpc=self.otlp_grpc))
        self.proc: subprocess.Popen | None = None

    def start(self) -> Jaeger:
        LOGS.mkdir(parents=True, exist_ok=True)
        self._log = open(LOGS / f"jaeger-{self.query}.log", "ab")
        self.proc = subprocess.Popen([str(program()), f"--config=file:{self.config}"], cwd=self.folder,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.get("/api/services")
                return self
            except OSError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"Jaeger did not start; read {LOGS / f'jaeger-{self.query}.log'}") from exc
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)

    def worker_env(self, **overrides: str) -> dict[str, str]:
        """A worker's settings that send its spans here (OTLP over HTTP)."""
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.otlp_http}",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "500", **overrides}

    def get(self, path: str, **query: str) -> dict:
        url = f"http://127.0.0.1:{self.query}{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())

    def trace(self, trace_id: str) -> list[dict]:
        """The spans Jaeger has of one trace (none yet: an empty list)."""
        try:
            found = self.get(f"/api/traces/{trace_id}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise
        return [span for data in found.get("data") or [] for span in data["spans"]]

    def find(self, service: str, operation: str, tags: dict[str, str]) -> list[dict]:
        """The spans of ``operation`` with these tags, in the last hour's traces of ``service``."""
        found = self.get("/api/traces", service=service, operation=operation, tags=json.dumps(tags),
                         lookback="1h", limit="50")
        return [span for data in found.get("data") or [] for span in data["spans"]
                if span["operationName"] == operation and all(str(tag_of(span, k)) == v for k, v in tags.items())]


def tag_of(span: dict, key: str):
    """A span's attribute as Jaeger gives it back (None when it has none)."""
    for tag in span.get("tags", ()):
        if tag["key"] == key:
            return tag["value"]
    return None
