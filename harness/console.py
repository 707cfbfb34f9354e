"""What the console's tests share: a worker of a module's own over fresh topics, with the
records it will dead-letter already on them (:func:`served_worker`); the JSON views called as
a browser calls them (:func:`call`); Debian's Chromium (:func:`chromium`)."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from app.adapters.kafka.topics import topic_specs
from app.settings import Settings
from harness.fakes import FakesProcess
from harness.services import ScratchDatabase, Topics, Worker, create_topics, delete_topics, produce, worker_env

# Headless, and none of Chromium's own traffic (updates, sync, QUIC probes) beside the page's.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium(playwright):
    """Debian's Chromium (the ``CHROMIUM`` variable names another), through Playwright."""
    return playwright.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                      args=CHROMIUM_ARGS)


def call(method: str, url: str, *, token: str | None = None, body: bytes | None = None,
         headers: dict | None = None) -> tuple[int, dict]:
    """One request to a JSON view: its status and its JSON (an error's too)."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@dataclass
class Served:
    base: str                    # the worker's web views, http://127.0.0.1:<port>
    worker: Worker
    topics: Topics
    fakes: FakesProcess | None


@contextmanager
def served_worker(settings: Settings, db: ScratchDatabase, name: str, records: list[tuple[bytes, bytes]], *,
                  fakes: dict | None = None, **env: str) -> Iterator[Served]:
    """A worker named ``name`` over a fresh topic pair of one partition each that holds ``records``;
    with ``fakes`` (their faults), the fake services in a process of their own behind its effects.
    Everything is stopped and deleted when the block ends, however it ends."""
    pair = Topics(settings, partitions=1, dlq_partitions=1)
    specs = topic_specs(settings.model_copy(update={"order_event_partitions": 1, "dlq_partitions": 1}),
                        events=pair.events, dlq=pair.dlq)
    asyncio.run(create_topics(settings, specs))
    services = worker = None
    try:
        if fakes is not None:
            services = FakesProcess()
            services.configure(fakes)
            env = {**services.env(), **env}
        asyncio.run(produce(settings, pair.events, records))
        worker = Worker(worker_env(**{"MYSQL_URL": db.url, "WORKER_ID": f"{name}-w", **pair.env(), **env}),
                        name).start()
        yield Served(f"http://127.0.0.1:{worker.web_port}", worker, pair, services)
    finally:
        if worker is not None:
            worker.stop()
        if services is not None:
            services.stop()
        asyncio.run(delete_topics(settings, [pair.events, pair.dlq]))
