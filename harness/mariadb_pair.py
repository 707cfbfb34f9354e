"""A MariaDB primary and its GTID replica that a test owns, to fail over:

    pair = MariaDBPair(semisync=True).start()
    url = pair.create_database("idem", "idem", "idem")   # on the primary, replicated, migrated
    pair.kill_primary()                                   # SIGKILL: a crash, no shutdown of any kind
    pair.promote(keep=[("idem", "t_idem", ("biz_key",))])  # applies what it received, then takes writes
    pair.restart_old_primary()                            # read-only, to count what it had and the replica not
    lost = pair.missing_on_replica("idem", "t_idem", ("biz_key",))   # vs the replica when promoted
    pair.stop()

Each server is ``mariadbd --no-defaults`` on a free 127.0.0.1 port, with a data directory,
socket, pid file and error log of its own in one temporary folder (the ``mysql`` user must
reach it: the project folder or pytest's 0700 temporary folders may not be reachable for it).
Both have a binary log in ROW format with GTIDs, ``log_slave_updates``, and server ids 1 and 2;
the replica is ``read_only`` and follows the primary with ``MASTER_USE_GTID=slave_pos``. With
``semisync`` the primary waits for the replica's acknowledgement at ``AFTER_SYNC`` (a commit
becomes visible on the primary only once the replica has it in its relay log), with a timeout
long enough that it never falls back to asynchronous replication while a test runs.

The shared server of ``make services`` (port 3306) is never touched. Processes an earlier
test run left behind (its own process killed) are SIGKILLed at the next start: a pid file
names each, and its command line must name its folder. This class knows nothing of pytest.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import closing
from pathlib import Path

import pymysql

from harness.services import free_port, migrate

READY_TIMEOUT = 90.0
SCRATCH_PREFIX = "mariadb-pair-"
REPL_USER, REPL_PASSWORD = "repl", "repl"
# Long enough that the primary never gives up waiting for the replica (and silently turns
# asynchronous) during a test, short enough that a replica that died does not hang it for ever.
SEMISYNC_TIMEOUT_MS = 120_000
COMMON_OPTIONS = ("--bind-address=127.0.0.1", "--skip-name-resolve", "--max-connections=300",
                  "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=32M",
                  "--character-set-server=utf8mb4", "--collation-server=utf8mb4_bin",
                  "--log-bin=mariadb-bin", "--binlog-format=ROW", "--log-slave-updates",
                  "--relay-log=relay-bin", "--skip-slave-start")


class PairError(AssertionError):
    """A server of the pair did not come up, or replication did not reach the state asked for."""


class Server:
    """One ``mariadbd`` of the pair: its files, its process, root on its socket."""

    def __init__(self, home: Path, name: str, server_id: int) -> None:
        self.name = name
        self.server_id = server_id
        self.port = free_port()
        self.home = home / name
        self.datadir = self.home / "data"
        self.socket = self.home / "mysqld.sock"
        self.error_log = self.home / "error.log"
        self.pid_file = self.home / "mariadbd.pid"
        self.proc: subprocess.Popen | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, options: list[str], timeout: float = READY_TIMEOUT) -> float:
        """Start on this server's data directory and port; return how long until it answered."""
        started = time.monotonic()
        command = ["/usr/sbin/mariadbd", "--no-defaults", f"--datadir={self.datadir}", f"--port={self.port}",
                   f"--socket={self.socket}", f"--pid-file={self.pid_file}", f"--log-error={self.error_log}",
                   f"--server-id={self.server_id}", *_as_mysql(), *COMMON_OPTIONS, *options]
        self.proc = subprocess.Popen(command, cwd=self.home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = started + timeout
        while not self._answers():
            if self.proc.poll() is not None:
                raise PairError(f"{self.name} exited ({self.proc.returncode}) while starting:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise PairError(f"{self.name} did not answer within {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.05)
        return time.monotonic() - started

    def kill(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)

    def stop(self) -> None:
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)

    def root(self) -> pymysql.connections.Connection:
        return pymysql.connect(unix_socket=str(self.socket), user="root", autocommit=True, connect_timeout=2,
                               cursorclass=pymysql.cursors.DictCursor)

    def query(self, sql: str, *args) -> list[dict]:
        with closing(self.root()) as conn, conn.cursor() as cur:
            cur.execute(sql, args or None)
            return list(cur.fetchall())

    def execute(self, *statements: str) -> None:
        with closing(self.root()) as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    def variable(self, name: str):
        return self.query(f"SELECT @@GLOBAL.{name} AS v")[0]["v"]

    def status(self, like: str) -> dict[str, str]:
        return {row["Variable_name"]: row["Value"] for row in self.query("SHOW GLOBAL STATUS LIKE %s", like)}

    def log_tail(self, lines: int = 30) -> str:
        if not self.error_log.exists():
            return "(no error log)"
        return "\n".join(self.error_log.read_text(errors="replace").splitlines()[-lines:])

    def _answers(self) -> bool:
        try:
            self.query("SELECT 1")
            return True
        except pymysql.MySQLError:
            return False


class MariaDBPair:
    def __init__(self, *, semisync: bool, semisync_timeout_ms: int = SEMISYNC_TIMEOUT_MS) -> None:
        self.semisync = semisync
        self.semisync_timeout_ms = semisync_timeout_ms
        self.home = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
        self.primary = Server(self.home, "primary", 1)
        self.replica = Server(self.home, "replica", 2)
        self.at_promotion: dict[tuple[str, str, tuple[str, ...]], set[tuple]] = {}

    # -- life ----------------------------------------------------------------------
    def start(self) -> MariaDBPair:
        """Both servers from fresh data directories, the replica following the primary; returns ``self``."""
        reap_leftovers()
        try:
            _claim(self.home)
            for server in (self.primary, self.replica):
                server.home.mkdir()
                _give_to_mysql(server.home)
                _install(server.datadir)
            self.primary.start(self._primary_options())
            self.primary.execute(f"CREATE USER '{REPL_USER}'@'127.0.0.1' IDENTIFIED BY '{REPL_PASSWORD}'",
                                 f"GRANT REPLICATION SLAVE ON *.* TO '{REPL_USER}'@'127.0.0.1'")
            self.replica.start(self._replica_options())
            self.replica.execute(
                f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={self.primary.port}, "
                f"MASTER_USER='{REPL_USER}', MASTER_PASSWORD='{REPL_PASSWORD}', MASTER_CONNECT_RETRY=1, "
                "MASTER_USE_GTID=slave_pos",
                "START SLAVE")
            self.wait_for(self._replicating, what="the replica's IO and SQL threads running")
            if self.semisync:
                # Only now: with no replica to wait for, every commit would wait out the timeout.
                self.primary.execute("SET GLOBAL rpl_semi_sync_master_enabled = ON")
                self.wait_for(lambda: self.primary.status("Rpl_semi_sync_master_clients")
                              .get("Rpl_semi_sync_master_clients") == "1", what="the replica acknowledging")
            self.wait_caught_up()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop both servers and remove their files. Safe to call twice."""
        for server in (self.replica, self.primary):
            server.stop()
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> MariaDBPair:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _primary_options(self) -> list[str]:
        if not self.semisync:
            return []
        return ["--rpl-semi-sync-master-wait-point=AFTER_SYNC",
                f"--rpl-semi-sync-master-timeout={self.semisync_timeout_ms}"]

    def _replica_options(self) -> list[str]:
        # Semi-sync's replica side only: a promoted replica with the primary side on and no
        # replica of its own would hold its first commit for the whole timeout.
        return ["--read-only=ON", *(["--rpl-semi-sync-slave-enabled=ON"] if self.semisync else [])]

    # -- what a test builds on it --------------------------------------------------
    def create_database(self, database: str, user: str, password: str, *, migrated: bool = True) -> str:
        """A database and its user on the primary (the replica gets both), migrated to head;
        returns its URL on the primary. The replica has applied it all when this returns."""
        self.primary.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
                             f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'",
                             f"GRANT ALL PRIVILEGES ON `{database}`.* TO '{user}'@'127.0.0.1'")
        url = self.url(self.primary, database, user, password)
        if migrated:
            migrate(url)
        self.wait_caught_up()
        return url

    @staticmethod
    def url(server: Server, database: str, user: str, password: str) -> str:
        return f"mysql+aiomysql://{user}:{password}@127.0.0.1:{server.port}/{database}"

    # -- the failover --------------------------------------------------------------
    def kill_primary(self) -> None:
        """SIGKILL the primary: no shutdown of any kind; what its binary log dump thread had not
        sent yet, the replica never gets."""
        self.primary.kill()

    def promote(self, keep: Iterable[tuple[str, str, tuple[str, ...]]] = (), timeout: float = 60.0) -> dict:
        """Make the replica the primary: it first applies everything it received (with semi-sync,
        that includes every transaction the old primary acknowledged to a client), then
        ``STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = OFF``. Returns its GTID positions
        as they were when it was promoted.

        ``keep``: ``(database, table, columns)`` whose rows are read after replication stopped
        and before the first client may write (:attr:`at_promotion`): what the replica had of
        the old primary, before clients write back rows the failover lost.

        ``STOP SLAVE`` alone would stop the SQL thread wherever it is: what is still in the relay
        log, which ``RESET SLAVE ALL`` then deletes, would be lost although the replica had it."""
        received = self.wait_for(self._applied_all_received, timeout=timeout,
                                 what="the replica applying all it received")
        self.replica.execute("STOP SLAVE", "RESET SLAVE ALL")
        for database, table, columns in keep:
            self.at_promotion[(database, table, columns)] = self.rows(self.replica, database, table, columns)
        self.replica.execute("SET GLOBAL read_only = OFF")
        return received

    def restart_old_primary(self) -> float:
        """Start the killed primary again, read-only and replicating from nobody, to read what it
        had; returns how long it took (crash recovery included). With semi-sync,
        ``--init-rpl-role=SLAVE`` has that recovery roll back the transactions of its binary log
        it had not committed yet (MDEV-21117, MDEV-33465), as an old primary rejoining as a replica
        must: under ``AFTER_SYNC`` those were waiting for the replica's acknowledgement, and no
        client was told they committed. Plain crash recovery would commit them, and count as
        lost what was never acknowledged."""
        if self.primary.alive:
            raise PairError("the primary still runs")
        options = ["--read-only=ON", *(["--init-rpl-role=SLAVE"] if self.semisync else [])]
        return self.primary.start(options)

    # -- what a test asks ----------------------------------------------------------
    def slave_status(self) -> dict:
        rows = self.replica.query("SHOW SLAVE STATUS")
        return rows[0] if rows else {}

    def gtid_positions(self) -> dict[str, str]:
        """GTIDs: the primary's binary log (while it runs), the replica's applied and received."""
        positions = {"replica_applied": self.replica.variable("gtid_slave_pos") or "",
                     "replica_received": self.slave_status().get("Gtid_IO_Pos", "") or ""}
        if self.primary.alive:
            positions["primary_binlog"] = self.primary.variable("gtid_binlog_pos") or ""
        return positions

    def lag(self) -> dict[str, int | None]:
        """How far behind the replica is: transactions of the primary's binary log not applied or not
        received yet (one replication domain, one writer), and ``Seconds_Behind_Master``."""
        positions = self.gtid_positions()
        written = seq_no(positions.get("primary_binlog", ""))
        return {"not_applied": None if written is None else written - (seq_no(positions["replica_applied"]) or 0),
                "not_received": None if written is None else written - (seq_no(positions["replica_received"]) or 0),
                "seconds_behind": self.slave_status().get("Seconds_Behind_Master")}

    def wait_caught_up(self, timeout: float = 60.0) -> None:
        self.wait_for(lambda: self.lag()["not_applied"] == 0, timeout=timeout, what="the replica caught up")

    def semisync_fell_back(self) -> int:
        """How often the primary stopped waiting for the replica (turned asynchronous) since it started."""
        return int(self.primary.status("Rpl_semi_sync_master_no_times").get("Rpl_semi_sync_master_no_times", 0))

    def rows(self, server: Server, database: str, table: str, columns: tuple[str, ...]) -> set[tuple]:
        names = ", ".join(f"`{c}`" for c in columns)
        return {tuple(row[c] for c in columns) for row in server.query(f"SELECT {names} FROM `{database}`.`{table}`")}

    def missing_on_replica(self, database: str, table: str, columns: tuple[str, ...]) -> set[tuple]:
        """Rows of ``table`` (as ``columns``) the primary has and the replica has not: what a
        failover lost. The replica's rows as :meth:`promote` kept them, if it did (after that the
        clients write to it, and may write back what was lost), else as they are now. The
        primary must run: before it is killed, or after :meth:`restart_old_primary`."""
        kept = self.at_promotion.get((database, table, columns))
        theirs = self.rows(self.replica, database, table, columns) if kept is None else kept
        return self.rows(self.primary, database, table, columns) - theirs

    def wait_for(self, predicate, *, timeout: float = 60.0, what: str = "condition"):
        """Poll ``predicate`` (a server error counts as "not yet") until truthy; fail with both logs."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
                if last:
                    return last
            except pymysql.MySQLError as exc:
                last = exc
            time.sleep(0.1)
        raise PairError(f"{what} not reached within {timeout:.0f}s (last: {last!r})\n"
                        f"--- primary:\n{self.primary.log_tail(15)}\n--- replica:\n{self.replica.log_tail(15)}")

    def _replicating(self) -> bool:
        status = self.slave_status()
        return status.get("Slave_IO_Running") == "Yes" and status.get("Slave_SQL_Running") == "Yes"

    def _applied_all_received(self) -> dict | None:
        """The positions once the SQL thread has nothing left in the relay log, else None."""
        status = self.slave_status()
        idle = str(status.get("Slave_SQL_Running_State", "")).startswith("Slave has read all relay log")
        positions = self.gtid_positions()
        if idle and seq_no(positions["replica_applied"]) == seq_no(positions["replica_received"]):
            return positions
        return None


def seq_no(gtids: str) -> int | None:
    """The sequence number of domain 0 in a GTID position such as ``0-1-42`` (None if absent)."""
    for gtid in filter(None, (part.strip() for part in gtids.split(","))):
        domain, _server, seq = gtid.split("-")
        if domain == "0":
            return int(seq)
    return None


_TEMPLATE: Path | None = None


def _install(datadir: Path) -> None:
    """A fresh data directory: a copy of one made once per process with mariadb-install-db
    (which takes seconds): root without a password, on the socket only."""
    global _TEMPLATE
    if _TEMPLATE is None:
        home = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
        _claim(home)
        atexit.register(shutil.rmtree, home, ignore_errors=True)
        (home / "tmp").mkdir()          # its own: bootstraps sharing /tmp collide on temporary tables
        _give_to_mysql(home / "tmp")
        done = subprocess.run(["mariadb-install-db", "--no-defaults", *_as_mysql(), f"--datadir={home / 'data'}",
                               f"--tmpdir={home / 'tmp'}", "--auth-root-authentication-method=normal",
                               "--skip-test-db", "--innodb-log-file-size=32M"],
                              capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise PairError(f"mariadb-install-db failed ({done.returncode}):\n"
                            f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        _TEMPLATE = home / "data"
    shutil.copytree(_TEMPLATE, datadir, symlinks=True)
    if os.geteuid() == 0:
        mysql = pwd.getpwnam("mysql")
        for folder, _dirs, files in os.walk(datadir):
            for path in (folder, *(os.path.join(folder, f) for f in files)):
                os.chown(path, mysql.pw_uid, mysql.pw_gid)


def _claim(home: Path) -> None:
    """``home`` belongs to this process (``owner.pid``): reaped once this process is gone."""
    _give_to_mysql(home)
    (home / "owner.pid").write_text(str(os.getpid()))


def reap_leftovers() -> None:
    """SIGKILL the servers of pairs whose test process died before stopping them, and remove
    their folders (a folder's ``owner.pid`` names its process; a server's command line must
    name the folder)."""
    reap(SCRATCH_PREFIX, lambda home: home.glob("*/mariadbd.pid"))


def reap(prefix: str, pid_files: Callable[[Path], Iterable[Path]],
         then: Callable[[Path], None] | None = None) -> None:
    """For each temporary folder ``prefix*`` whose owner (``owner.pid``) is no longer running: SIGKILL
    the process each of ``pid_files(folder)`` names if its command line names the folder, call
    ``then(folder)``, and remove the folder."""
    for home in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            owner = int((home / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if _running(owner):
            continue
        for pid_file in pid_files(home):
            try:
                pid = int(pid_file.read_text())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ValueError):
                continue
            if str(home) in cmdline:
                os.kill(pid, signal.SIGKILL)
        if then is not None:
            then(home)
        shutil.rmtree(home, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _as_mysql() -> list[str]:
    # As root, mariadbd must be told to switch to its own user; as anybody else it runs as them.
    return ["--user=mysql"] if os.geteuid() == 0 else []


def _give_to_mysql(path: Path) -> None:
    if os.geteuid() != 0:
        return
    mysql = pwd.getpwnam("mysql")
    os.chown(path, mysql.pw_uid, mysql.pw_gid)
