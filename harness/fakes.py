"""The fake logistics/SMS services, in this process or as a process of their own."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from contextlib import asynccontextmanager

from aiohttp import web

from app.demo.fakes import FakeServices, worker_urls
from harness.services import LOGS, ROOT, free_port


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
    """``python -m app.demo.fakes`` on a free port, driven over HTTP like the real thing."""

    def __init__(self, config: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        LOGS.mkdir(parents=True, exist_ok=True)
        self._log = open(LOGS / f"fakes-{self.port}.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "app.demo.fakes", "--port", str(self.port),
                                      "--config", json.dumps(config or {})], cwd=ROOT,
                                     stdout=self._log, stderr=subprocess.STDOUT)
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
        return worker_urls(self.url)

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
