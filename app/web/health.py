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
from collections.abc import Mapping

from aiohttp import web
from faust.types import AgentT
from prometheus_client import generate_latest

from app.adapters.kafka.dlq import KafkaDeadLetterSink
from app.adapters.mysql.reads.console import Queries
from app.pipeline import liveness
from app.web.http import Routes, json_response

log = logging.getLogger(__name__)
# The bound on each of /readyz's two checks (the database's, then Kafka's): a probe of it may take
# twice this (deploy/helm's readiness probe's timeout is computed from it).
READINESS_CHECK_SECONDS = 10


async def health(request: web.Request) -> web.Response:
    return json_response({"ok": True})


async def healthz(request: web.Request) -> web.Response:
    return json_response({"ok": True})


async def readyz(request: web.Request, *, queries: Queries, dead_letters: KafkaDeadLetterSink,
                 agents: Mapping[str, AgentT]) -> web.Response:
    # Open to any prober: it says what is down, never why (that is in the log). The runtime not open
    # (not yet, or no longer) fails both checks at their first use.
    checks: dict[str, str] = {}
    try:
        await asyncio.wait_for(queries.ping(), READINESS_CHECK_SECONDS)
        checks["mysql"] = "ok"
    except Exception as exc:
        log.warning("readiness: MySQL unreachable: %r", exc)
        checks["mysql"] = "unreachable"
    try:
        await asyncio.wait_for(dead_letters.ping(), READINESS_CHECK_SECONDS)
        checks["kafka"] = "ok"
    except Exception as exc:
        log.warning("readiness: Kafka unreachable: %r", exc)
        checks["kafka"] = "unreachable"
    for name, agent in agents.items():
        checks[f"agent {name}"] = "crashed" if agent.crashed else "running" if agent.started else "not started"
    # The watchdog's verdict (app.pipeline.liveness): "ok", or which check fails and for how long.
    checks["consumer"] = liveness.latest().reason
    ready = all(value in ("ok", "running") for value in checks.values())
    return json_response({"ready": ready, "checks": checks}, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    # prometheus_client's CONTENT_TYPE_LATEST carries a charset, which aiohttp refuses here.
    return web.Response(body=generate_latest(), content_type="text/plain; version=0.0.4")


ROUTES: Routes = {
    "/health": {"get": health},
    "/healthz": {"get": healthz},
    "/readyz": {"get": readyz},
    "/metrics": {"get": metrics},
}
