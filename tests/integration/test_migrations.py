"""The Alembic chain is linear, reversible, and matches the metadata in tables/."""

from __future__ import annotations

from contextlib import closing

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.config import Config
from sqlalchemy import create_engine

from tables import metadata
from tests.support import sql_modes
from tests.support.services import ROOT, ScratchDatabase

pytestmark = pytest.mark.integration
# Every database test here runs under the server's sql_mode and under MySQL 8's.
settings, scratch_db = sql_modes.each_sql_mode()


def test_chain_is_linear():
    script = ScriptDirectory.from_config(Config(str(ROOT / "alembic.ini")))
    assert len(script.get_heads()) == 1
    assert len(script.get_bases()) == 1


def schema(db: ScratchDatabase) -> dict[str, str]:
    tables = [next(iter(r.values())) for r in db.query("SHOW TABLES")]
    return {t: db.query(f"SHOW CREATE TABLE `{t}`")[0]["Create Table"] for t in tables if t != "alembic_version"}


def test_each_revision_downgrades_to_exactly_the_schema_before_it(settings):
    script = ScriptDirectory.from_config(Config(str(ROOT / "alembic.ini")))
    revisions = [r.revision for r in reversed(list(script.walk_revisions()))]
    db = ScratchDatabase(settings.mysql_url, sql_mode=settings.db_sql_mode).create(migrated=False)
    try:
        previous = "base"
        for revision in revisions:
            before = schema(db)
            db.migrate(revision)
            db.migrate(previous, down=True)
            assert schema(db) == before, f"downgrade of {revision} does not restore the schema"
            db.migrate(revision)
            previous = revision
    finally:
        db.drop()


def test_upgrade_downgrade_upgrade_and_schema_matches_metadata(settings):
    db = ScratchDatabase(settings.mysql_url, sql_mode=settings.db_sql_mode).create(migrated=False)
    try:
        db.migrate()
        db.migrate("base", down=True)
        assert db.query("SHOW TABLES LIKE 't\\_%%'") == []
        db.migrate()
        engine = create_engine(db.url.replace("+aiomysql", "+pymysql"))
        with closing(engine.connect()) as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
        engine.dispose()
        assert diff == [], f"migrations and tables/ disagree: {diff}"
    finally:
        db.drop()

