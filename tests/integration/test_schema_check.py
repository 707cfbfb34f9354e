"""A worker runs on a schema at its own head or on a newer one that still serves its release: one
started on a database whose migrations are behind its code, or on a newer schema that no longer
serves its release, stops at start-up (exit 78) with what to run or which releases fit, instead of
failing every batch that touches a newer table (or writing what a newer release no longer reads)."""

from __future__ import annotations

import pytest

from app.adapters.mysql.schema import revisions
from app.version import VERSION
from harness.services import ScratchDatabase, wait_for, worker_metric


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
    assert "the database's schema is at revision 0007, release" in logs and "needs" in logs
    assert "python -m app.admin migrate" in logs and "Traceback" not in logs


@pytest.fixture
def migrated(settings):
    db = ScratchDatabase(settings.database.url).create()
    yield db
    db.drop()


def test_the_migration_says_which_releases_the_schema_serves(migrated):
    [row] = migrated.query("SELECT revision, oldest_release, migrated_by FROM t_schema_release")
    assert row == {"revision": revisions()[0], "oldest_release": "1.0.0", "migrated_by": VERSION}


def test_a_worker_on_a_newer_schema_that_no_longer_serves_its_release_does_not_start(migrated, topics, spawn_worker):
    # What a release that contracted the schema leaves behind for a worker of this one: a revision
    # this code does not know, serving releases from a later one.
    migrated.query("UPDATE alembic_version SET version_num = '9999'")
    migrated.query("UPDATE t_schema_release SET revision = '9999', oldest_release = '99.0.0'")
    worker = spawn_worker(topics(partitions=1), MYSQL_URL=migrated.url)
    assert worker.wait_exit(120) == 78
    logs = worker.logs()
    assert "serves release 99.0.0 and later" in logs and f"this worker is release {VERSION}" in logs
    assert "Traceback" not in logs


def test_a_worker_on_a_newer_schema_that_still_serves_its_release_runs(migrated, topics, spawn_worker):
    migrated.query("UPDATE alembic_version SET version_num = '9999'")
    migrated.query("UPDATE t_schema_release SET revision = '9999'")
    worker = spawn_worker(topics(partitions=1), MYSQL_URL=migrated.url)
    worker.wait_log("serves release 1.0.0 and later: going on", timeout=120)
    wait_for(lambda: worker_metric(worker, "order_build_info",
                                   f'{{code_revision="{revisions()[0]}",schema_revision="9999",version="{VERSION}"}}') == 1,
             timeout=60, what="order_build_info with the schema it runs on", workers=[worker])
