"""The chaos run's database as a primary and its GTID replica (``--db-failover semisync|async``),
the failover between them, and the count of what it lost.

    primary   mariadbd with a binary log (ROW, GTIDs), server_id 1; with ``semisync`` a commit
              waits, at AFTER_SYNC, until the replica has it in its relay log, and the wait
              never runs out during a run (it would turn asynchronous without a word)
    replica   a second mariadbd with its own data directory, port and socket, server_id 2,
              read_only, following the primary with MASTER_USE_GTID=slave_pos

The failover (``harness.chaos.storm.Storm.fail_over_database`` drives it):

    behind    async only: the replica's IO thread stops, as a loaded replica's falls behind;
              what the primary commits from then on, and acknowledges, never reaches it
    kill      SIGKILL the primary
    promote   the replica applies all it received, then STOP SLAVE; RESET SLAVE ALL; its rows
              are read (what the failover kept), then it takes writes (read_only=OFF)

After the run, :meth:`ReplicatedMariaDB.forensics` starts the dead primary's data directory again,
standalone, and compares what it committed with what the replica held when promoted. To the
driver and the storm this object is "the database" (``port``, ``kill``, ``start``, ``create``,
...): each means the current primary, so the storm's MariaDB restart hits the promoted replica
once the failover is over.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import closing
from pathlib import Path

import pymysql
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from app.adapters.kafka.connection import connection_of
from harness.own_servers import MariaDB, ServiceError

MODES = ("semisync", "async")
REPL_USER, REPL_PASSWORD = "repl", "repl-chaos"
# An hour, in milliseconds: within a run the primary never stops waiting for the replica.
SEMISYNC_TIMEOUT_MS = 3_600_000
BINLOG = ("--log-bin=mariadb-bin", "--binlog-format=ROW", "--log-slave-updates", "--relay-log=relay-bin",
          "--skip-slave-start")
SEMISYNC_PRIMARY = ("--rpl-semi-sync-master-wait-point=AFTER_SYNC",
                    f"--rpl-semi-sync-master-timeout={SEMISYNC_TIMEOUT_MS}")
# What a failover can lose, per table: the key, and the columns whose latest value must have
# reached the replica. Rows the old primary has and the replica lacks are "missing"; rows it
# has in another state (a step done there, pending on the replica) are "behind".
TABLES = {
    "t_idem": (("biz_key", "part_date"), ("status", "attempt", "outcome", "idem_token")),
    "t_order": (("order_no",), ("status", "paid_cents", "cancel_reason")),
    "t_waybill_receipt": (("order_no",), ("waybill_no", "idem_token", "attempt")),
    "t_compensation": (("consumer_group", "src_topic", "src_partition", "src_offset", "src_timestamp"),
                       ("status", "attempts", "redrives")),
}
SAMPLE = 20


class ReplicatedMariaDB:
    def __init__(self, folder: Path, mode: str, database: str) -> None:
        if mode not in MODES:
            raise ValueError(f"--db-failover is one of {', '.join(MODES)}, not {mode!r}")
        self.mode, self.semisync, self.database = mode, mode == "semisync", database
        self.primary = MariaDB(folder / "mariadb", options=("--server-id=1", *BINLOG, *self._semisync(False)))
        self.replica = MariaDB(folder / "mariadb-replica", name="mariadb-replica",
                               options=("--server-id=2", *BINLOG, "--read-only=ON",
                                        *(("--rpl-semi-sync-slave-enabled=ON",) if self.semisync else ())))
        self.current = self.primary
        self.brought_up = False
        self.kept: dict[str, dict] = {}           # the replica's rows when it was promoted
        self.promoted: dict = {}                  # its GTID positions then
        self.record: dict = {"mode": mode}        # what the failover did, for the manifest

    # -- "the database", as the driver and the storm see it -----------------------------
    @property
    def port(self) -> int:
        return self.current.port

    @property
    def ready_seconds(self) -> dict:
        return {"primary": self.primary.ready_seconds, "replica": self.replica.ready_seconds}

    def reap_leftover(self) -> None:
        self.primary.reap_leftover()
        self.replica.reap_leftover()

    def install(self) -> None:
        self.primary.install()
        self.replica.install()

    def start(self) -> float:
        """The first time: both servers, the replica following the primary (semi-synchronously
        with ``semisync``), timed until the primary answered. Later: the current primary
        started again on its data (the storm's MariaDB restart)."""
        if self.brought_up:
            return self.current.start()
        took = self.primary.start()
        _execute(self.primary, f"CREATE USER '{REPL_USER}'@'127.0.0.1' IDENTIFIED BY '{REPL_PASSWORD}'",
                      f"GRANT REPLICATION SLAVE ON *.* TO '{REPL_USER}'@'127.0.0.1'")
        self.replica.start()
        _execute(self.replica,
                      f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={self.primary.port}, "
                      f"MASTER_USER='{REPL_USER}', MASTER_PASSWORD='{REPL_PASSWORD}', MASTER_CONNECT_RETRY=1, "
                      "MASTER_USE_GTID=slave_pos", "START SLAVE")
        self._wait(self._replicating, "the replica's IO and SQL threads running")
        if self.semisync:
            # Only now: with no replica connected yet, every commit would wait out the timeout.
            _execute(self.primary, "SET GLOBAL rpl_semi_sync_master_enabled = ON")
            self._wait(self._acknowledging, "Rpl_semi_sync_master_status ON, the replica acknowledging")
            self.primary.options = ("--server-id=1", *BINLOG, *self._semisync(True))
        self.brought_up = True
        return took

    def kill(self) -> None:
        self.current.kill()

    def stop(self) -> None:
        for server in (self.replica, self.primary):
            try:
                server.stop()
            finally:
                server.remove_data()

    def remove_data(self) -> None:
        self.primary.remove_data()
        self.replica.remove_data()

    def create(self, database: str, user: str, password: str) -> str:
        """The run's database and user on the primary (the replica gets them, and the migrations,
        through replication); returns its URL on the primary once the replica has it all."""
        url = self.primary.create(database, user, password)
        self._wait(self._caught_up, "the replica applying the migrations")
        self.record["before_storm"] = self.state()
        return url

    def url(self, database: str, user: str, password: str, port: int | None = None) -> str:
        return self.current.url(database, user, password, port=port)

    def log_tail(self, lines: int = 40) -> str:
        return self.current.log_tail(lines)

    # -- what the storm asks ---------------------------------------------------------------
    def state(self) -> dict:
        """GTID positions, and with semisync the primary's acknowledgement figures."""
        found = {"primary_binlog": _variable(self.primary, "gtid_binlog_pos") if self.primary.alive else None}
        status = _slave_status(self.replica)
        found.update({"replica_received": status.get("Gtid_IO_Pos"), "replica_applied":
                      _variable(self.replica, "gtid_slave_pos"), "replica_io": status.get("Slave_IO_Running"),
                      "replica_sql": status.get("Slave_SQL_Running")})
        if self.semisync and self.primary.alive:
            found["semisync"] = self.semisync_status()
        return found

    def written(self) -> int:
        """The last transaction of the primary's binary log (its GTID sequence number)."""
        return _seq(_variable(self.primary, "gtid_binlog_pos")) or 0

    def unreplicated(self) -> int:
        """Transactions of the primary's binary log the replica has not received."""
        return self.written() - (_seq(_slave_status(self.replica).get("Gtid_IO_Pos")) or 0)

    def semisync_status(self) -> dict[str, str]:
        """``Rpl_semi_sync_master_*`` of the primary: ``status`` ON while it waits for the replica,
        ``no_times`` how often it gave up waiting, ``no_tx`` commits that did not wait."""
        rows = _query(self.primary, "SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_%'")
        return {row["Variable_name"][len("Rpl_semi_sync_master_"):].lower(): row["Value"] for row in rows}

    def fall_behind(self) -> dict:
        """The replica stops receiving: what the primary commits from now on is not replicated."""
        _execute(self.replica, "STOP SLAVE IO_THREAD")
        return self.state()

    def kill_primary(self) -> dict:
        """SIGKILL the primary, with what was known just before."""
        before = self.state()
        self.primary.kill()
        return before

    def promote(self, timeout: float = 120.0) -> dict:
        """The replica applies everything it received (with semisync that is every commit the old
        primary acknowledged), then stops replicating for good; its rows are kept, as they are
        before any client writes, then it takes writes. ``STOP SLAVE`` alone would stop the SQL
        thread wherever it is, and ``RESET SLAVE ALL`` delete the relay log it had not applied."""
        clock = time.monotonic()
        positions = self._wait(self._applied_all_received, "the replica applying all it received", timeout)
        _execute(self.replica, "STOP SLAVE", "RESET SLAVE ALL")
        self.kept = {table: _rows(self.replica, self.database, table) for table in TABLES}
        _execute(self.replica, "SET GLOBAL read_only = OFF")
        # Started again (the storm's restart) it stays a primary: writable, following nobody.
        self.replica.options = ("--server-id=2", *BINLOG)
        self.current = self.replica
        self.promoted = positions
        return {**positions, "seconds": round(time.monotonic() - clock, 2),
                "rows_kept": {table: len(rows) for table, rows in self.kept.items()}}

    def windows(self) -> list[dict]:
        """The recovery windows on the current primary."""
        return _query(self.current, f"SELECT id, opened_at, opened_by, reason FROM `{self.database}`."
                                    "t_recovery_window ORDER BY id")

    # -- after the run --------------------------------------------------------------------
    def forensics(self) -> dict:
        """Start the dead primary's data directory again, standalone and read-only, and count what
        it committed that the replica lacked when promoted: transactions (GTIDs) and rows.

        ``--init-rpl-role=SLAVE``: its crash recovery rolls back the transactions its binary log
        holds but its engine had not committed (MDEV-21117), as an old primary rejoining as a
        replica must. Under AFTER_SYNC those were waiting for the replica's acknowledgement and
        no client was told they committed; plain crash recovery would commit them, and count as
        lost what was never acknowledged. Without semisync the same rule holds, for a shorter
        window (between the binary log's write and the engine's commit).

        What counts as lost: :func:`compare`."""
        if self.primary.alive or not self.kept:
            raise ServiceError("forensics need a primary that was killed and a replica that was promoted")
        self.primary.options = ("--server-id=1", *BINLOG, "--read-only=ON", "--init-rpl-role=SLAVE")
        took = self.primary.start()
        try:
            committed = _variable(self.primary, "gtid_binlog_pos") or ""
            theirs = {table: _rows(self.primary, self.database, table) for table in TABLES}
        finally:
            self.primary.stop()
        return {"forensic_start_seconds": round(took, 2),
                **compare(theirs, self.kept, committed, self.promoted.get("replica_applied", ""))}

    # -- helpers ------------------------------------------------------------------------
    def _semisync(self, enabled: bool) -> tuple[str, ...]:
        if not self.semisync:
            return ()
        return (*SEMISYNC_PRIMARY, *(("--rpl-semi-sync-master-enabled=ON",) if enabled else ()))

    def _acknowledging(self) -> bool:
        found = self.semisync_status()
        return found.get("status") == "ON" and found.get("clients") == "1"

    def _replicating(self) -> bool:
        status = _slave_status(self.replica)
        return status.get("Slave_IO_Running") == "Yes" and status.get("Slave_SQL_Running") == "Yes"

    def _caught_up(self) -> bool:
        return _seq(_variable(self.primary, "gtid_binlog_pos")) == _seq(_variable(self.replica, "gtid_slave_pos"))

    def _applied_all_received(self) -> dict | None:
        """The positions once the SQL thread has applied everything in the relay log, else None."""
        status = _slave_status(self.replica)
        idle = str(status.get("Slave_SQL_Running_State", "")).startswith("Slave has read all relay log")
        received, applied = status.get("Gtid_IO_Pos") or "", _variable(self.replica, "gtid_slave_pos") or ""
        if idle and _seq(received) == _seq(applied):
            return {"replica_received": received, "replica_applied": applied}
        return None

    def _wait(self, predicate, what: str, timeout: float = 60.0):
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            try:
                last = predicate()
                if last:
                    return last
            except pymysql.MySQLError as exc:
                last = exc
            time.sleep(0.1)
        raise ServiceError(f"{what} not reached within {timeout:.0f}s (last: {last!r}); primary:\n"
                           f"{self.primary.log_tail(10)}\nreplica:\n{self.replica.log_tail(10)}")



def compare(old_primary: dict[str, dict], replica: dict[str, dict], committed: str, applied: str) -> dict:
    """What the failover lost: the old primary's rows (``{table: {key: values}}``, after its
    recovery; ``committed`` its GTID position) against the replica's when it was promoted
    (``applied`` its position then).

    One writer, one GTID domain: what the replica applied is a prefix of the old primary's
    binary log, or the other way round (the replica had transactions the recovery rolled back).
    So the GTIDs say on which side a row that differs is behind: with the old primary ahead, it
    is a row the failover lost ("behind"); with the replica ahead, a row of a transaction no
    client was told of ("newer_on_replica"). A row only the old primary has is lost either way
    ("missing"); ``keys`` lists the ledger's missing rows, for the checker."""
    ahead = (_seq(committed) or 0) - (_seq(applied) or 0)
    lost, newer, only_replica = {}, {}, {}
    for table, rows in old_primary.items():
        kept = replica[table]
        missing = sorted(key for key in rows if key not in kept)
        differ = sorted(key for key, values in rows.items() if key in kept and kept[key] != values)
        behind = differ if ahead > 0 else []
        lost[table] = {"missing": len(missing), "behind": len(behind),
                       "sample": [_plain(key) for key in (missing + behind)[:SAMPLE]]}
        newer[table] = 0 if ahead > 0 else len(differ)
        only_replica[table] = sum(1 for key in kept if key not in rows)
    if "t_compensation" in old_primary:
        lost["t_compensation"]["keys"] = [_plain(key) for key in old_primary["t_compensation"]
                                          if key not in replica["t_compensation"]]
    return {"gtid": {"old_primary_committed": committed, "replica_applied_at_promotion": applied},
            "lost_transactions": max(ahead, 0), "transactions_only_on_replica": max(-ahead, 0),
            "lost": lost, "lost_total": sum(t["missing"] + t["behind"] for t in lost.values()),
            "newer_on_replica": newer, "only_on_replica": only_replica}


# -- the operator's rewind after a failover that lost rows ------------------------------------

async def rewind_group(kafka, group: str, topic: str, partitions: int, to_ms: int, *,
                       empty_within: float = 60.0) -> dict:
    """``kafka-consumer-groups --reset-offsets --to-datetime`` for ``topic``: each partition's
    committed offset goes back to the first record at or after ``to_ms`` (never forward). The
    group must be empty (its workers stopped): a commit from outside a live group is refused."""
    options = connection_of(kafka).client_options()
    admin = AIOKafkaAdminClient(request_timeout_ms=10_000, **options)
    await admin.start()
    try:
        deadline = time.monotonic() + empty_within
        while True:
            [described] = await admin.describe_consumer_groups([group])
            state = described.groups[0][2] if hasattr(described, "groups") else None
            if state in ("Empty", "Dead") or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(group_id=group, enable_auto_commit=False, **options)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        committed = {tp.partition: (await consumer.committed(tp)) or 0 for tp in tps}
        found = await consumer.offsets_for_times({tp: to_ms for tp in tps})
        ends = await consumer.end_offsets(tps)
        target = {tp.partition: min(committed[tp.partition], found[tp].offset if found[tp] else ends[tp])
                  for tp in tps}
        await consumer.commit({tp: target[tp.partition] for tp in tps})
    finally:
        await consumer.stop()
    return {"group_state": state, "committed_before": committed, "committed_after": target,
            "records": sum(committed[p] - target[p] for p in committed)}


# -- the servers, as root on their sockets -----------------------------------------------------

def _query(server: MariaDB, sql: str, args=None) -> list[dict]:
    conn = pymysql.connect(unix_socket=str(server.socket), user="root", autocommit=True, connect_timeout=2,
                           cursorclass=pymysql.cursors.DictCursor)
    with closing(conn), conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def _execute(server: MariaDB, *statements: str) -> None:
    with closing(server.root()) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def _variable(server: MariaDB, name: str) -> str | None:
    return _query(server, f"SELECT @@GLOBAL.{name} AS v")[0]["v"]


def _slave_status(server: MariaDB) -> dict:
    rows = _query(server, "SHOW SLAVE STATUS")
    return rows[0] if rows else {}


def _rows(server: MariaDB, database: str, table: str) -> dict[tuple, tuple]:
    key, values = TABLES[table]
    conn = pymysql.connect(unix_socket=str(server.socket), user="root", autocommit=True, connect_timeout=2,
                           read_timeout=300)
    with closing(conn), conn.cursor() as cur:
        cur.execute(f"SELECT {', '.join(key + values)} FROM `{database}`.`{table}`")
        return {row[:len(key)]: row[len(key):] for row in cur.fetchall()}


def _seq(gtids: str | None) -> int | None:
    """Domain 0's sequence number in a GTID position such as ``0-1-42`` (one writer at a time)."""
    for gtid in filter(None, (part.strip() for part in (gtids or "").split(","))):
        domain, _server, seq = gtid.split("-")
        if domain == "0":
            return int(seq)
    return None


def _plain(key: tuple) -> list:
    return [value if isinstance(value, (int, str)) or value is None else str(value) for value in key]
