"""Fixtures for real services: a scratch database per session, fresh topics
and consumer groups per test, and worker processes that are always reaped.

Each test is marked by its folder: ``unit`` (no services), ``integration`` and ``chaos`` (the real
Kafka and MariaDB), so ``pytest -m integration`` or ``-m "not integration and not chaos"`` selects.
The fixtures below are the only ones that reach a service, and each starts when a test asks for it
(never at collection or at the session's start): a unit test that asked for one would need the
services, so that is refused at collection."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from app.adapters.kafka.topics import topic_specs
from app.settings import Settings
from harness.fakes import fakes_in_process
from harness.pipeline import Harness
from harness.services import (
    TEST_TOKEN_SECRET,
    ScratchDatabase,
    ScratchDatabases,
    Topics,
    Worker,
    create_topics,
    delete_topics,
    worker_env,
)

os.environ.setdefault("IDEM_TOKEN_SECRET", TEST_TOKEN_SECRET)

TESTS = Path(__file__).resolve().parent
FOLDER_MARKS = {"unit": "unit", "integration": "integration", "chaos": "chaos"}
# The fixtures of this module that reach Kafka, MariaDB or worker processes.
SERVICE_FIXTURES = {"scratch_dbs", "scratch_db", "topics", "spawn_worker", "harness"}


def pytest_collection_modifyitems(config, items):
    """Mark each test by its folder, and refuse a unit test that needs a service."""
    needs_services = []
    for item in items:
        try:
            folder = item.path.resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue
        mark = FOLDER_MARKS.get(folder)
        if mark:
            item.add_marker(getattr(pytest.mark, mark))
        if folder == "unit" and SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            needs_services.append(item.nodeid)
    if needs_services:
        raise pytest.UsageError(f"unit tests run without services; these ask for a fixture that needs them "
                                f"({', '.join(sorted(SERVICE_FIXTURES))}), move them to tests/integration: "
                                f"{needs_services}")


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings()


@pytest.fixture(scope="session")
def scratch_dbs():
    """The session's scratch databases, one per sql_mode (``harness/sql_modes.py``)."""
    databases = ScratchDatabases()
    yield databases
    databases.drop()


@pytest.fixture(scope="session")
def scratch_db(settings: Settings, scratch_dbs: ScratchDatabases) -> ScratchDatabase:
    return scratch_dbs.get(settings)


@pytest.fixture
def own_db(settings: Settings):
    """A database of this test's own, migrated, dropped after it: for a test that reads a table whole
    over a time range (a reconcile reads the range's waybill receipts whichever test wrote them)."""
    db = ScratchDatabase(settings.database.url).create()
    yield db
    db.drop()


@pytest.fixture
def topics(settings: Settings):
    made: list[Topics] = []

    def make(partitions: int = 4, dlq_partitions: int = 3) -> Topics:
        pair = Topics(settings, partitions, dlq_partitions)
        specs = topic_specs(settings.model_copy(update={"order_event_partitions": partitions,
                                                         "dlq_partitions": dlq_partitions}),
                            events=pair.events, dlq=pair.dlq)
        asyncio.run(create_topics(settings, specs))
        made.append(pair)
        return pair

    yield make
    for pair in made:
        asyncio.run(delete_topics(settings, [pair.events, pair.dlq]))


@pytest.fixture
def spawn_worker(scratch_db: ScratchDatabase, request):
    """Start ``faust -A app worker`` processes against the scratch database."""
    workers: list[Worker] = []

    def spawn(topics: Topics, name: str = "w", **overrides: str) -> Worker:
        mode = {"DB_SQL_MODE": scratch_db.sql_mode} if scratch_db.sql_mode else {}
        env = worker_env(**{"MYSQL_URL": scratch_db.url, "WORKER_ID": f"{request.node.name[:40]}-{name}",
                            **mode, **topics.env(), **overrides})
        worker = Worker(env, f"{request.node.name[:60]}-{name}").start()
        workers.append(worker)
        return worker

    yield spawn
    for worker in workers:
        if worker.alive:
            worker.kill()
            worker.wait_exit(30)


@pytest.fixture
async def harness(settings, scratch_db):
    """The pipeline in this process, with the fake services in this event loop."""
    async with fakes_in_process() as (fakes, url):
        h = Harness(settings, scratch_db, url)
        h.fakes = fakes
        yield h
        await h.close()
