"""The fake providers (``demo/fakes/``), in this process or as a process of their own: every fake
the registry lists (``demo.fakes.registry``), and the settings that send a worker's calls there."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from contextlib import asynccontextmanager

from aiohttp import web

from demo.fakes.registry import each, worker_settings
from demo.fakes.server import FakeServices
from harness import preload
from harness.services import LOGS, ROOT, free_port


def every_fake(faults: Mapping[str, object]) -> dict[str, dict]:
    """``faults`` on every fake the registry lists, as ``POST /__config`` takes them (a benchmark's latency)."""
    return each(faults)


@asynccontextmanager
async def fakes_in_process(config: dict | None = None):
    """Yield ``(fakes, base_url)`` served on a free port of this event loop."""
    fakes = FakeServices()
    fakes.configure(config or {})
    runner = web.AppRunner(fakes.app(), access_log=None)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield fakes, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


class FakesProcess:
    """``python -m demo.fakes`` on a free port, driven over HTTP like the real thing. ``env``: the
    process's environment (this one's by default); one that names modules of a test's own
    (``harness.preload``) serves their fakes too."""

    def __init__(self, config: dict | None = None, env: Mapping[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        LOGS.mkdir(parents=True, exist_ok=True)
        self._log = open(LOGS / f"fakes-{self.port}.log", "ab")
        env = dict(os.environ if env is None else env)
        argv = preload.command("demo.fakes", ["--port", str(self.port), "--config", json.dumps(config or {})], env)
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/__health", timeout=1)
                break
            except OSError as exc:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise AssertionError("fake services did not start") from exc
                time.sleep(0.1)

    def env(self) -> dict[str, str]:
        """A worker's settings that send every effect to these fakes."""
        return worker_settings(self.url)

    def _post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(f"{self.url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=10).read())

    def ledger(self) -> dict:
        return json.loads(urllib.request.urlopen(f"{self.url}/__ledger", timeout=30).read())

    def configure(self, config: dict) -> None:
        self._post("/__config", config)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:     # calls still hanging in an outage keep it from stopping
            self.proc.kill()
            self.proc.wait(10)
