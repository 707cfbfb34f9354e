"""The chaos run's own Kafka broker and MariaDB server: processes it may SIGKILL.

The shared services (``make services``, ports 9092 and 3306) serve every other test
session on this machine and are never touched here. These two are started from
scratch in ``.cache/chaos/`` on free ports, killed with SIGKILL and started again on
the same data directory and port, and stopped when the run ends (whatever happens):

    MariaDB   mariadb-install-db into a fresh data directory, then mariadbd --no-defaults;
              a database and a user of the run, migrated with the project's migrations
    Kafka     KRaft, one node (broker and controller), the jars ``make services`` fetched,
              ops/kafka/server.properties.in with ports and data directory of its own

Each start is timed (until the server answers), so the report can say what a restart
cost. A pid file per server and process (``<name>.<pid of the run's process>.pid``) lets a
later run SIGKILL what a run whose process died could not stop (its own servers only: the
pid must still run a command naming this folder), and never the servers of a run that
another test process runs at the same time (``make test`` runs several).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import closing
from pathlib import Path

import pymysql

from harness.java import kafka_libs
from harness.kafka_cluster import new_cluster_id
from harness.services import ROOT, free_port, migrate

CHAOS = ROOT / ".cache" / "chaos"
MARIADB_SCRATCH = "chaos-mariadb-"      # the run's MariaDB files: <temp folder>/chaos-mariadb-<port>
READY_TIMEOUT = 90.0


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class ServiceError(AssertionError):
    """A server of the run did not come up (or went away on its own)."""


class Server:
    """One server process of the run, on a fixed port and data directory."""

    name = "server"

    def __init__(self, home: Path) -> None:
        self.home = home
        self.log = home / f"{self.name}.log"
        self.pid_file = CHAOS / f"{self.name}.{os.getpid()}.pid"
        self.proc: subprocess.Popen | None = None
        self.ready_seconds: list[float] = []     # one per start, until the server answered

    # -- what a subclass says ------------------------------------------------------
    def command(self) -> list[str]:
        raise NotImplementedError

    def answers(self) -> bool:
        raise NotImplementedError

    # -- life and death ------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = READY_TIMEOUT) -> float:
        """Start the server and wait until it answers; return how long that took."""
        self._mark = self.log.stat().st_size if self.log.exists() else 0
        started = time.monotonic()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.command(), cwd=self.home, stdout=log, stderr=subprocess.STDOUT)
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)     # a fresh clone has no .cache/chaos yet
        self.pid_file.write_text(str(self.proc.pid))
        deadline = started + timeout
        while not self.answers():
            if self.proc.poll() is not None:
                raise ServiceError(f"{self.name} exited ({self.proc.returncode}) while starting; "
                                   f"read {self.log.relative_to(ROOT)}")
            if time.monotonic() > deadline:
                raise ServiceError(f"{self.name} did not answer within {timeout:.0f}s; "
                                   f"read {self.log.relative_to(ROOT)}")
            time.sleep(0.05)
        took = time.monotonic() - started
        self.ready_seconds.append(round(took, 3))
        return took

    def kill(self) -> None:
        """SIGKILL: no shutdown of any kind, as a crash or the OOM killer would do it."""
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)

    def stop(self) -> None:
        """A clean stop at the end of the run (SIGKILL if it does not stop in 30 s)."""
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.pid_file.unlink(missing_ok=True)

    def reap_leftover(self) -> None:
        """SIGKILL a server an earlier run left behind: one whose run's process is gone (or is this
        one), named by its pid file, whose command line names this folder (a recycled pid of
        somebody else's process is left alone). A run of another live process keeps its servers."""
        for pid_file in [CHAOS / f"{self.name}.pid", *CHAOS.glob(f"{self.name}.*.pid")]:
            owner = pid_file.name[len(self.name) + 1:-len(".pid")]
            if owner.isdigit() and int(owner) != os.getpid() and _running(int(owner)):
                continue
            self._reap(pid_file)

    def _reap(self, pid_file: Path) -> None:
        try:
            pid = int(pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            pid_file.unlink(missing_ok=True)
            return
        if str(CHAOS) in cmdline or (self.name.startswith("mariadb") and MARIADB_SCRATCH in cmdline):
            os.kill(pid, signal.SIGKILL)
            for _ in range(100):
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.05)
        pid_file.unlink(missing_ok=True)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class MariaDB(Server):
    name = "mariadb"

    def __init__(self, home: Path, *, name: str = "mariadb", options: tuple[str, ...] = ()) -> None:
        """``name`` names its pid file and logs (a second server of the run needs its own);
        ``options``: more ``mariadbd`` options (a replication role), read at every start."""
        self.name = name
        self.options = tuple(options)
        super().__init__(home)
        self.port = free_port()
        # The server's own files live in the temp folder, not in the project: mariadbd runs as
        # ``mysql``, which may not be allowed into the folder the project was cloned to (a
        # ``mktemp -d`` is 0700), and a unix socket's path is at most 107 bytes. The error log
        # is copied into the run's folder when the server stops.
        self.scratch = Path(tempfile.gettempdir()) / f"{MARIADB_SCRATCH}{self.port}"
        self.datadir = self.scratch / "data"
        self.socket = self.scratch / "mysqld.sock"
        self.error_log = self.scratch / "error.log"

    def install(self) -> None:
        """A fresh data directory (root without a password, on the socket only)."""
        shutil.rmtree(self.home, ignore_errors=True)
        self.home.mkdir(parents=True)
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.scratch.mkdir(parents=True)
        _give_to_mysql(self.scratch)
        done = subprocess.run(["mariadb-install-db", "--no-defaults", *self._user(), f"--datadir={self.datadir}",
                               "--auth-root-authentication-method=normal", "--skip-test-db"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise ServiceError(f"mariadb-install-db failed ({done.returncode}):\n{done.stdout[-2000:]}"
                               f"{done.stderr[-2000:]}")

    def command(self) -> list[str]:
        return ["/usr/sbin/mariadbd", "--no-defaults", f"--datadir={self.datadir}", f"--port={self.port}",
                f"--socket={self.socket}", "--bind-address=127.0.0.1", *self._user(),
                f"--log-error={self.error_log}", f"--pid-file={self.scratch / 'mariadbd.pid'}",
                "--skip-name-resolve", "--max-connections=500", "--innodb-buffer-pool-size=256M",
                "--character-set-server=utf8mb4", "--collation-server=utf8mb4_bin", *self.options]

    def answers(self) -> bool:
        try:
            with closing(self.root()) as conn, conn.cursor() as cur:
                cur.execute("SELECT 1")
            return True
        except pymysql.MySQLError:
            return False

    def root(self) -> pymysql.connections.Connection:
        return pymysql.connect(unix_socket=str(self.socket), user="root", autocommit=True, connect_timeout=2)

    def create(self, database: str, user: str, password: str, *, migrated: bool = True) -> str:
        """A database and a user of the run, migrated to head (unless not ``migrated``: the caller
        migrates it, e.g. with an earlier release's migrations); returns its URL (direct, no proxy)."""
        with closing(self.root()) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
            cur.execute(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY %s", (password,))
            cur.execute(f"GRANT ALL PRIVILEGES ON `{database}`.* TO '{user}'@'127.0.0.1'")
        url = self.url(database, user, password)
        if migrated:
            migrate(url)
        return url

    def url(self, database: str, user: str, password: str, port: int | None = None) -> str:
        return f"mysql+aiomysql://{user}:{password}@127.0.0.1:{port or self.port}/{database}"

    def stop(self) -> None:
        super().stop()
        if self.error_log.exists():
            shutil.copyfile(self.error_log, self.home / "error.log")
        shutil.rmtree(self.scratch, ignore_errors=True)

    def remove_data(self) -> None:
        shutil.rmtree(self.datadir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        log = self.error_log if self.error_log.exists() else self.home / "error.log"
        if not log.exists():
            return super().log_tail(lines)
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    @staticmethod
    def _user() -> list[str]:
        # As root, mariadbd must be told to switch to its own user; as anybody else it runs as them.
        return ["--user=mysql"] if os.geteuid() == 0 else []


class Kafka(Server):
    name = "kafka"

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.port = free_port()
        self.controller_port = free_port()
        self.datadir = home / "data"
        self.properties = home / "server.properties"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def install(self) -> None:
        """A fresh KRaft data directory, formatted like ops/services.sh does it."""
        shutil.rmtree(self.home, ignore_errors=True)
        self.datadir.mkdir(parents=True)
        template = (ROOT / "ops" / "kafka" / "server.properties.in").read_text()
        rendered = (template.replace("@PORT@", str(self.port))
                    .replace("@CONTROLLER_PORT@", str(self.controller_port))
                    .replace("@DATA_DIR@", str(self.datadir)))
        # A broker killed with SIGKILL stays registered until its session times out (9 s by
        # default); its next incarnation cannot register before that. One node restarted on
        # purpose: let that take 3 s.
        rendered += "\nbroker.session.timeout.ms=3000\nbroker.heartbeat.interval.ms=500\n"
        self.properties.write_text(rendered)
        cluster_id = new_cluster_id()
        done = subprocess.run([*self._java(), "kafka.tools.StorageTool", "format", "-t", cluster_id,
                               "-c", str(self.properties)], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise ServiceError(f"formatting Kafka storage failed ({done.returncode}):\n{done.stdout[-2000:]}"
                               f"{done.stderr[-2000:]}")

    def command(self) -> list[str]:
        return [*self._java(), "kafka.Kafka", str(self.properties)]

    def answers(self) -> bool:
        with open(self.log, "rb") as log:
            log.seek(self._mark)
            if b"Kafka Server started" not in log.read():
                return False
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    @staticmethod
    def _java() -> list[str]:
        heap = os.environ.get("KAFKA_HEAP_OPTS", "-Xms256m -Xmx768m").split()
        return ["java", *heap, f"-Dlog4j2.configurationFile={ROOT / 'ops' / 'kafka' / 'log4j2.properties'}",
                "-cp", f"{kafka_libs()}/*"]


def _give_to_mysql(path: Path) -> None:
    if os.geteuid() != 0:
        return
    mysql = pwd.getpwnam("mysql")
    os.chown(path, mysql.pw_uid, mysql.pw_gid)
