"""The Alembic chain is linear, reversible, and matches the metadata in tables/."""

from __future__ import annotations

from contextlib import closing

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from app.adapters.mysql.schema import alembic_config
from harness import sql_modes
from harness.services import ScratchDatabase
from tables import metadata

# Every database test here runs under the server's sql_mode and under MySQL 8's.
settings, scratch_db = sql_modes.each_sql_mode()


def test_chain_is_linear():
    script = ScriptDirectory.from_config(alembic_config())
    assert len(script.get_heads()) == 1
    assert len(script.get_bases()) == 1


def schema(db: ScratchDatabase) -> dict[str, str]:
    tables = [next(iter(r.values())) for r in db.query("SHOW TABLES")]
    return {t: _keys_sorted(db.query(f"SHOW CREATE TABLE `{t}`")[0]["Create Table"])
            for t in tables if t != "alembic_version"}


def _keys_sorted(create: str) -> str:
    """The statement with its secondary keys in name order: an index dropped and made again by a
    downgrade comes back last, the same schema."""
    lines = create.split("\n")
    keys = sorted(line.rstrip(",") for line in lines if line.lstrip().startswith("KEY "))
    return "\n".join([line.rstrip(",") for line in lines if not line.lstrip().startswith("KEY ")] + keys)


def test_each_revision_downgrades_to_exactly_the_schema_before_it(settings):
    script = ScriptDirectory.from_config(alembic_config())
    revisions = [r.revision for r in reversed(list(script.walk_revisions()))]
    db = ScratchDatabase(settings.database.url, sql_mode=settings.database.sql_mode).create(migrated=False)
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
    db = ScratchDatabase(settings.database.url, sql_mode=settings.database.sql_mode).create(migrated=False)
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


def test_the_walking_skeletons_rows_get_the_date_in_their_key_or_1970(settings):
    """0002 dates each existing row by its key (ORD-YYYYMMDD-...). A key without a real date
    there gets 1970-01-01 under every mode: strict mode made STR_TO_DATE stop the migration
    at such a key, and without NO_ZERO_DATE it wrote zero dates."""
    dates = {"ORD-20261129-1": "2026-11-29", "ORD-20240229-2": "2024-02-29", "ORD-20261231-3": "2026-12-31",
             "ORD-20250229-4": "1970-01-01", "ORD-20260230-5": "1970-01-01", "ORD-20261100-6": "1970-01-01",
             "ORD-20261301-7": "1970-01-01", "ORD-00000000-8": "1970-01-01", "ORD-09991231-9": "1970-01-01",
             "ORD-2026XX29-a": "1970-01-01", "ORD-2026113": "1970-01-01", "x": "1970-01-01"}
    db = ScratchDatabase(settings.database.url, sql_mode=settings.database.sql_mode).create(migrated=False)
    try:
        db.migrate("0001")
        for key in dates:
            db.query("INSERT INTO t_idem (biz_key, status) VALUES (%s, 2)", key)
        db.migrate("0002")
        assert {r["biz_key"]: r["part_date"].isoformat() for r in db.query("SELECT biz_key, part_date FROM t_idem")} \
            == dates
        db.migrate()
        assert len(db.query("SELECT 1 FROM t_idem")) == len(dates)
    finally:
        db.drop()
