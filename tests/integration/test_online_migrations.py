"""Every migration since the first release runs while the workers write, also behind a long transaction.

Each migration since the first release is run on a partitioned ``t_idem`` with rows in many months and a
ledger with rows, while a writer does what T1 and T3 do (an upsert that claims a key, an update that
finishes it) and writes dead letters, and while a long transaction holds ``t_idem`` and the ledger
open. What holds:

* every statement that changes a table that exists says ``ALGORITHM=INSTANT`` or ``ALGORITHM=INPLACE,
  LOCK=NONE`` and is its migration's only statement (``harness/migration_rules.py``); MariaDB refuses
  such a statement when it cannot run so, so the migration's success proves it does;
* while the migration waits for the metadata lock behind the long transaction, the writer's
  statements go on (the migration's session gives up after ``lock_wait_timeout`` and tries again):
  without that, they queue behind the waiting ``ALTER`` until the long transaction ends;
* when the long transaction ends, the migration finishes; the writer never failed;
* a run that never gets its lock stops after ``MIGRATION_LOCK_TRIES``, the schema as it was.
"""

from __future__ import annotations

import logging
import threading
import uuid
from argparse import Namespace
from contextlib import closing

import pytest
from alembic import command
from alembic.config import Config
from alembic.util import CommandError

from harness.migration_rules import changed_table, online_problems, recorded_statements, since_release
from harness.own_servers import MariaDB
from harness.services import ROOT, ScratchDatabase, connect, migrate, wait_for

LEDGER = "t_compensation"
HELD = ("t_idem", LEDGER)          # what the long transaction reads, and the writer writes
LOCK_WAIT_SECONDS = 1


class Migration(threading.Thread):
    """``alembic upgrade <revision>`` in a thread, its statements recorded; ``waited`` once a
    metadata lock wait ran out and the run was put off."""

    def __init__(self, url: str, revision: str, *, tries: int = 60) -> None:
        super().__init__(daemon=True)
        self.config = Config(str(ROOT / "alembic.ini"))
        self.config.cmd_opts = Namespace(x=[f"url={url}", f"lock_wait_seconds={LOCK_WAIT_SECONDS}",
                                            f"lock_tries={tries}"])
        self.revision = revision
        self.waited = threading.Event()
        self.error: BaseException | None = None
        self.statements: list[str] = []

    def run(self) -> None:
        watcher = _Waits(self.waited)
        logging.getLogger("app.adapters.mysql.migration_locks").addHandler(watcher)
        try:
            with recorded_statements() as seen:
                command.upgrade(self.config, self.revision)
            self.statements = seen
        except BaseException as exc:       # noqa: B036 -- handed to the test's thread
            self.error = exc
        finally:
            logging.getLogger("app.adapters.mysql.migration_locks").removeHandler(watcher)


class _Waits(logging.Handler):
    def __init__(self, flag: threading.Event) -> None:
        super().__init__(logging.WARNING)
        self.flag = flag

    def emit(self, record: logging.LogRecord) -> None:
        self.flag.set()


class Writer(threading.Thread):
    """T1 and T3 of one key after another on its own connection (each its own transaction), and a
    dead letter every fifth key: what a worker does to ``t_idem`` and the ledger."""

    def __init__(self, db: ScratchDatabase) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.commits = 0
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        with closing(self.db.connect()) as conn, conn.cursor() as cur:
            n = 0
            while not self.stopping.is_set():
                n += 1
                key = f"ORD-W-{n}:ORDER_CONFIRM:issue_waybill"
                try:
                    cur.execute("START TRANSACTION")
                    cur.execute("INSERT INTO t_idem (biz_key, part_date, step, status, attempt, owner, lease_until, "
                                "payload_hash) VALUES (%s, CURDATE(), 'issue_waybill', 1, 1, 'writer', "
                                "NOW(3) + INTERVAL 30 SECOND, 'h') ON DUPLICATE KEY UPDATE attempt = attempt + 1",
                                (key,))
                    cur.execute("COMMIT")
                    cur.execute("START TRANSACTION")
                    cur.execute("UPDATE t_idem SET status = 2, outcome = 'waybill_issued', lease_until = NULL "
                                "WHERE biz_key = %s AND part_date = CURDATE() AND attempt = 1", (key,))
                    if n % 5 == 0:
                        _dead_letter(cur, 1_000_000 + n)
                    cur.execute("COMMIT")
                    self.commits += 1
                except Exception as exc:   # recorded: the test fails on any
                    self.errors.append(f"{key}: {exc}")
                    cur.execute("ROLLBACK")


def _dead_letter(cur, offset: int) -> None:
    cur.execute(f"INSERT INTO {LEDGER} (src_topic, src_partition, src_offset, consumer_group, status, reason, "
                "retriable, attempts, first_failure_at) VALUES ('order-event', 0, %s, 'app', 1, 'internal_error', "
                "1, 1, NOW(3))", (offset,))


def fill(db: ScratchDatabase) -> None:
    """36,000 done rows over the last 18 months (``p_before`` and monthly partitions), 300 dead letters."""
    with closing(db.connect()) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO t_idem (biz_key, part_date, step, status, attempt, owner, payload_hash, outcome) "
                    "SELECT CONCAT('ORD-F-', seq, ':ORDER_CREATED:create_order'), CURDATE() - INTERVAL (seq MOD 540) "
                    "DAY, 'create_order', 2, 1, 'filler', SHA2(seq, 256), 'applied' FROM seq_1_to_36000")
        for offset in range(300):
            _dead_letter(cur, offset)
    assert db.scalar("SELECT COUNT(DISTINCT EXTRACT(YEAR_MONTH FROM part_date)) FROM t_idem") >= 18
    assert db.scalar("SELECT COUNT(*) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() "
                     "AND TABLE_NAME = 't_idem'") > 12


def waiting_for_a_metadata_lock(db: ScratchDatabase) -> bool:
    return bool(db.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() "
                          "AND STATE LIKE 'Waiting for table metadata lock%%'"))


class LongTransaction:
    """A transaction that has read ``t_idem`` and the ledger and stays open: it holds their metadata
    locks shared until it ends (a person's console session, an export)."""

    def __init__(self, url: str) -> None:
        self.conn = connect(url)
        with self.conn.cursor() as cur:
            cur.execute("START TRANSACTION")
            for table in HELD:
                cur.execute(f"SELECT COUNT(*) FROM {table} WHERE status = 1")

    def end(self) -> None:
        if self.conn.open:
            self.conn.rollback()
            self.conn.close()


@pytest.fixture
def migrated_to_release(settings):
    """A scratch database at the first release's revision, filled; and the revisions since."""
    base, revisions = since_release()
    db = ScratchDatabase(settings.database.url, label=f"online_{uuid.uuid4().hex[:8]}").create(migrated=False)
    try:
        db.migrate(base)
        fill(db)
        yield db, base, revisions
    finally:
        db.drop()


def test_each_migration_since_the_release_runs_online_behind_a_long_transaction(migrated_to_release):
    db, _, revisions = migrated_to_release
    assert revisions, "no migration since the first release: nothing to hold to the rule"
    writer = Writer(db)
    writer.start()
    try:
        for revision in revisions:
            migration = run_behind_a_long_transaction(db, revision, writer)
            assert not migration.is_alive(), f"{revision} did not finish after the long transaction ended"
            assert migration.error is None, f"{revision} failed: {migration.error}"
            assert online_problems(revision, migration.statements) == []
        writes_go_on(writer, "after the migrations")
    finally:
        writer.stopping.set()
        writer.join(30)
    assert writer.errors == []
    assert db.scalar("SELECT version_num FROM alembic_version") == revisions[-1]


def run_behind_a_long_transaction(db: ScratchDatabase, revision: str, writer: Writer) -> Migration:
    held = LongTransaction(db.url)
    migration = Migration(db.url, revision)
    try:
        migration.start()
        wait_for(lambda: migration.waited.is_set() or waiting_for_a_metadata_lock(db) or not migration.is_alive(),
                 timeout=60, what=f"{revision} waiting for a lock behind the long transaction, or done")
        if migration.is_alive():
            # Still held: the writer's statements must go on between the migration's tries.
            writes_go_on(writer, f"while {revision} waits behind a long transaction")
    finally:
        held.end()
    migration.join(60)
    return migration


def writes_go_on(writer: Writer, when: str) -> None:
    start = writer.commits
    wait_for(lambda: writer.commits >= start + 3, timeout=30, what=f"T1/T3 writes going on {when}")


def test_a_migration_that_never_gets_its_lock_stops_and_changes_nothing(migrated_to_release):
    db, base, revisions = migrated_to_release
    held = LongTransaction(db.url)
    migration = Migration(db.url, "head", tries=2)
    try:
        migration.start()
        migration.join(60)
        stopped_while_held = not migration.is_alive()
    finally:
        held.end()
    migration.join(60)
    if migration.error is None and not {changed_table(s) for s in migration.statements} & set(HELD):
        pytest.skip("no migration since the first release changes t_idem or the ledger")
    assert stopped_while_held, "the migration waited for its lock as long as the long transaction lasted"
    assert isinstance(migration.error, CommandError)
    assert "did not come in 2 tries of 1s" in str(migration.error)
    assert "MIGRATION_LOCK_TRIES" in str(migration.error)
    version = db.scalar("SELECT version_num FROM alembic_version")
    assert version in [base, *revisions[:-1]], "a migration that waited in vain was recorded as done"
    migration = Migration(db.url, "head")           # and run again once nothing holds the tables
    migration.start()
    migration.join(60)
    assert migration.error is None


def test_the_run_that_stops_names_the_transaction_that_held_the_table(tmp_path):
    """With the PROCESS privilege (a server of the test's own, to grant it), the line that stops the
    run says which connection held the table open, and since when."""
    base, revisions = since_release()
    server = MariaDB(tmp_path / "mariadb", name="mariadb-online-migrations")
    server.install()
    server.start()
    try:
        with closing(server.root()) as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE idem CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
            cur.execute("CREATE USER 'app'@'127.0.0.1' IDENTIFIED BY 'app'")
            cur.execute("GRANT ALL PRIVILEGES ON idem.* TO 'app'@'127.0.0.1'")
            cur.execute("GRANT PROCESS ON *.* TO 'app'@'127.0.0.1'")
        url = server.url("idem", "app", "app")
        migrate(url, base)
        held = LongTransaction(url)
        with held.conn.cursor() as cur:
            cur.execute("SELECT CONNECTION_ID() AS id")
            holder = cur.fetchone()["id"]
        migration = Migration(url, "head", tries=1)
        try:
            migration.start()
            migration.join(60)
        finally:
            held.end()
        if migration.error is None and not {changed_table(s) for s in migration.statements} & set(HELD):
            pytest.skip("no migration since the first release changes t_idem or the ledger")
        assert isinstance(migration.error, CommandError)
        assert f"Transactions open longest: connection {holder} (app@" in str(migration.error)
    finally:
        server.stop()
