"""The schema rule: this code's migrations only expand what the previous release reads and writes,
so that the previous release's workers run on the schema they leave (a rolling upgrade runs both in
one group, and a rollback runs the previous release on it again).

Two ways, both against real MariaDB, with the previous release built from its commit
(``harness/releases.py``):

* what the schema holds: a database migrated by the previous release and one migrated by it and
  then by this code are compared column by column: every table and column the previous release
  has is still there, no narrower, no less nullable; a column this code adds to one of its tables
  is nullable or has a default (its inserts name none of them); no unique key is added to its
  tables (its writes could fail on one);
* what the previous release does on it: its own store tests (the SQL of T1/T3, the state machine's
  scenarios, the ledger's moves, the pipeline in one process) run against databases its harness
  migrates, each then migrated on to this code's head by this code's own command
  (``harness/plugins/newer_schema.py``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from harness.releases import ROOT, previous_release
from harness.services import ScratchDatabase, migrate

# The previous release's tests that exercise the store (and not its own migrations): its statements,
# its scenarios, its ledger, its pipeline; under the server's sql_mode (the mysql8 one runs the same SQL).
STORE_TESTS = ["tests/integration/test_store_sql.py", "tests/integration/test_store_scenarios.py",
               "tests/integration/test_ledger_moves.py", "tests/integration/test_pipeline.py"]
COLUMNS = ("SELECT TABLE_NAME AS t, COLUMN_NAME AS c, COLUMN_TYPE AS type, IS_NULLABLE AS nullable, "
           "COLUMN_DEFAULT AS dflt, EXTRA AS extra FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()")
UNIQUE = ("SELECT TABLE_NAME AS t, INDEX_NAME AS i, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) AS cols "
          "FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND NON_UNIQUE = 0 "
          "GROUP BY TABLE_NAME, INDEX_NAME")
INTEGERS = ["tinyint", "smallint", "mediumint", "int", "bigint"]
TEXTS = ["tinytext", "text", "mediumtext", "longtext"]
BLOBS = ["tinyblob", "blob", "mediumblob", "longblob"]


@pytest.fixture(scope="module")
def previous():
    return previous_release()


def migrated_by(release, settings) -> ScratchDatabase:
    """A database migrated to ``release``'s head by its own migrations."""
    db = ScratchDatabase(settings.database.url).create(migrated=False)
    done = subprocess.run([str(release.python), "-m", "alembic", "-c", str(release.src / "alembic.ini"),
                           "-x", f"url={db.url}", "upgrade", "head"], cwd=release.src, env=release.env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return db


def widened(old: str, new: str) -> bool:
    """Whether a column of type ``old`` may be read and written as before as ``new``."""
    if old == new:
        return True
    o, n = re.match(r"(\w+)(?:\((\d+)(?:,(\d+))?\))?(.*)", old), re.match(r"(\w+)(?:\((\d+)(?:,(\d+))?\))?(.*)", new)
    (ob, ol, _, orest), (nb, nl, _, nrest) = o.groups(), n.groups()
    if orest.strip() != nrest.strip():                  # unsigned, a charset or collation: not the same values
        return False
    for ladder in (INTEGERS, TEXTS, BLOBS):
        if ob in ladder and nb in ladder:
            return ladder.index(nb) >= ladder.index(ob)
    if ob == nb and ob in ("varchar", "varbinary", "char", "binary", "datetime", "decimal") and ol and nl:
        return int(nl) >= int(ol) if ob != "datetime" else nl == ol
    return ob == "varchar" and nb in TEXTS


def contractions(before: list[dict], after: list[dict], unique_before: list[dict], unique_after: list[dict]) -> list[str]:
    """What this code's migrations took away from the previous release's schema (empty: only expanded)."""
    found: list[str] = []
    old = {(r["t"], r["c"]): r for r in before}
    new = {(r["t"], r["c"]): r for r in after}
    tables = {t for t, _ in old}
    for (table, column), was in old.items():
        now = new.get((table, column))
        if now is None:
            found.append(f"{table}.{column} is gone (dropped or renamed): the previous release reads or writes it")
            continue
        if not widened(was["type"], now["type"]):
            found.append(f"{table}.{column} went from {was['type']} to {now['type']}: narrower, or other values")
        if was["nullable"] == "YES" and now["nullable"] != "YES":
            found.append(f"{table}.{column} is NOT NULL now: the previous release may write NULL")
    for (table, column), now in new.items():
        if table in tables and (table, column) not in old and now["nullable"] != "YES" and now["dflt"] is None \
                and "auto_increment" not in now["extra"]:
            found.append(f"{table}.{column} is new, NOT NULL and without a default: the previous release's inserts "
                         "name no such column and fail")
    keys_before = {(r["t"], r["i"]) for r in unique_before}
    for row in unique_after:
        if row["t"] in tables and (row["t"], row["i"]) not in keys_before:
            found.append(f"{row['t']} has a new unique key {row['i']} ({row['cols']}): the previous release's writes "
                         "may break it")
    return found


def test_the_migrations_since_the_previous_release_only_expand_its_schema(settings, previous):
    theirs = migrated_by(previous, settings)
    ours = migrated_by(previous, settings)
    try:
        migrate(ours.url)                   # this code's migrations, on from the previous release's head
        assert contractions(theirs.query(COLUMNS), ours.query(COLUMNS), theirs.query(UNIQUE), ours.query(UNIQUE)) == []
    finally:
        theirs.drop()
        ours.drop()


def test_the_previous_releases_store_tests_pass_on_this_codes_schema(previous):
    env = previous.env()
    env.update(PYTHONPATH=f"{previous.src}{os.pathsep}{ROOT / 'harness' / 'plugins'}",
               NEWER_SCHEMA_PYTHON=sys.executable, NEWER_SCHEMA_ROOT=str(ROOT))
    done = subprocess.run([str(previous.python), "-m", "pytest", *STORE_TESTS, "-q", "-x", "-k", "not mysql8",
                           "-p", "newer_schema", "-p", "no:cacheprovider"],
                          cwd=previous.src, env=env, capture_output=True, text=True, timeout=900)
    tail = "\n".join(done.stdout.splitlines()[-30:])
    assert done.returncode == 0, f"release {previous.version}'s store tests on this code's schema:\n{tail}\n{done.stderr[-2000:]}"
    assert re.search(r"\d+ passed", done.stdout), tail


def test_a_dropped_column_is_a_contraction():
    # The check itself, on the shapes it reads: a column gone, narrowed, made NOT NULL, a new column
    # the previous release's inserts cannot fill, a new unique key.
    before = [{"t": "t_idem", "c": "outcome", "type": "varchar(64)", "nullable": "YES", "dflt": None, "extra": ""},
              {"t": "t_idem", "c": "attempt", "type": "int(11)", "nullable": "NO", "dflt": None, "extra": ""}]
    after = [{"t": "t_idem", "c": "attempt", "type": "smallint(6)", "nullable": "NO", "dflt": None, "extra": ""},
             {"t": "t_idem", "c": "shard", "type": "int(11)", "nullable": "NO", "dflt": None, "extra": ""}]
    found = contractions(before, after, [], [{"t": "t_idem", "i": "uk_shard", "cols": "shard"}])
    assert len(found) == 4 and "outcome is gone" in found[0] and "attempt went from int(11) to smallint(6)" in found[1]
    assert "shard is new, NOT NULL" in found[2] and "uk_shard" in found[3]
    assert contractions(before, [*before, {**after[1], "nullable": "YES"}], [], []) == []
    assert widened("varchar(64)", "varchar(128)") and widened("int(11)", "bigint(20)") and widened("text", "mediumtext")
    assert not widened("varchar(64)", "varchar(32)") and not widened("bigint(20)", "bigint(20) unsigned")
