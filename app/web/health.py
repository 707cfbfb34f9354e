"""Liveness, readiness and metrics.

    GET /health, /healthz   the process answers (200)
    GET /readyz             MySQL and Kafka answer, the agents run and the watchdog sees the consumer in its
                            group and moving (200), or what does not (503)
    GET /metrics            Prometheus

Open to anyone who reaches the port (probes, scrapers): they show no data and no internals.
"""

from __future__ import annotations

import asyncio
import logging

import faust
from aiohttp import web
from faust.web import View
from prometheus_client import generate_latest

from app.bootstrap import Runtime
from app.pipeline import liveness
from app.settings import Settings
from app.web.http import json_response

log = logging.getLogger(__name__)
# The bound on each of /readyz's two checks (the database's, then Kafka's): a probe of it may take
# twice this (deploy/helm's readiness probe's timeout is computed from it).
READINESS_CHECK_SECONDS = 10


def register(app: faust.App, runtime: Runtime, settings: Settings) -> None:
    @app.page("/health")
    async def health(self: View, request: web.Request) -> web.Response:
        return json_response({"ok": True})

    @app.page("/healthz")
    async def healthz(self: View, request: web.Request) -> web.Response:
        return json_response({"ok": True})

    @app.page("/readyz")
    async def readyz(self: View, request: web.Request) -> web.Response:
        # Open to any prober: it says what is down, never why (that is in the log).
        checks: dict[str, str] = {}
        try:
            rt = runtime.started()
            await asyncio.wait_for(rt.queries.ping(), READINESS_CHECK_SECONDS)
            checks["mysql"] = "ok"
        except Exception as exc:
            log.warning("readiness: MySQL unreachable: %r", exc)
            checks["mysql"] = "unreachable"
        try:
            await asyncio.wait_for(runtime.kafka_ping(), READINESS_CHECK_SECONDS)
            checks["kafka"] = "ok"
        except Exception as exc:
            log.warning("readiness: Kafka unreachable: %r", exc)
            checks["kafka"] = "unreachable"
        for name, agent in app.agents.items():
            checks[f"agent {name}"] = "crashed" if agent.crashed else "running" if agent.started else "not started"
        # The watchdog's verdict (app.pipeline.liveness): "ok", or which check fails and for how long.
        checks["consumer"] = liveness.latest().reason
        ready = all(value in ("ok", "running") for value in checks.values())
        return json_response({"ready": ready, "checks": checks}, status=200 if ready else 503)

    @app.page("/metrics")
    async def metrics(self: View, request: web.Request) -> web.Response:
        # prometheus_client's CONTENT_TYPE_LATEST carries a charset, which aiohttp refuses here.
        return self.bytes(generate_latest(), content_type="text/plain; version=0.0.4")
