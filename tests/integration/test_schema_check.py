"""A worker started on a database whose migrations are behind its code stops at start-up (exit 78)
with what to run, instead of failing every batch that touches a newer table."""

from __future__ import annotations

import pytest

from harness.services import ScratchDatabase


@pytest.fixture
def behind(settings):
    db = ScratchDatabase(settings.database.url).create(migrated=False)
    db.migrate("0007")
    yield db
    db.drop()


def test_a_worker_on_a_schema_behind_its_code_does_not_start(behind, topics, spawn_worker):
    worker = spawn_worker(topics(partitions=1), MYSQL_URL=behind.url)
    assert worker.wait_exit(120) == 78
    logs = worker.logs()
    assert "the database's schema is at revision 0007, this code needs" in logs
    assert "alembic upgrade head" in logs and "Traceback" not in logs
