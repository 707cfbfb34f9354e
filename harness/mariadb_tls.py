"""A MariaDB of the tests' own that speaks only TLS, and the certificates to talk to it.

The shared MariaDB (``make services``, port 3306) has TLS off and is never reconfigured. This one
is started from scratch for a test module: ``mariadb-install-db`` into a fresh data directory,
then Debian's ``/usr/sbin/mariadbd --no-defaults`` on a free port and a socket of its own, with

    ssl_ca / ssl_cert / ssl_key      a throwaway CA (made with ``openssl`` at test time) and a
                                     server certificate for IP:127.0.0.1 and DNS:localhost
    require_secure_transport=ON      every TCP connection must be TLS (the socket is exempt: the
                                     tests' own root connection uses it)

and two accounts: ``app`` (a password; TLS is enough) and ``mtls`` (a password and ``REQUIRE
X509``: a client certificate the server's CA signed). The certificates (:func:`make_certificates`)
also hold a client certificate of that CA, a second CA that signed nothing the server knows, a
client certificate of that second CA, and a server certificate for another host name
(``db.example.net``), which :meth:`MariaDbTls.serve_certificate` swaps in with ``FLUSH SSL``.

mariadbd runs as ``mysql`` when the tests run as root (it refuses to run as root), so its files
live in a folder of the temp directory given to ``mysql`` (a pytest tmp dir is 0700 root, and a
socket path has at most 107 bytes); the certificates are made in the pytest tmp dir and copied
there. :meth:`MariaDbTls.stop` kills the server and waits for it, and the fixture calls it
whatever the tests did; a server an earlier session left behind (its pytest was killed) is
reaped by its pid file on the next start.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
from contextlib import closing
from pathlib import Path

import pymysql

from harness.services import free_port, wait_for

SCRATCH_PREFIX = "tls-mariadb-"          # <temp dir>/tls-mariadb-<port>: the server's own files
MARIADBD = "/usr/sbin/mariadbd"
DATABASE = "idem_tls"
PASSWORDS = {"app": "app-" + uuid.uuid4().hex[:12], "mtls": "mtls-" + uuid.uuid4().hex[:12]}


# ------------------------------------------------------------- certificates --

def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise AssertionError(f"openssl {' '.join(args[:2])} failed: {done.stderr[-2000:]}")


def _new_ca(folder: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "2",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN=db-tls test {name} {uuid.uuid4().hex[:8]}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=folder)


def _issue(folder: Path, name: str, ca: str, subject: str, extensions: str) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-sha256", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", subject, cwd=folder)
    (folder / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-sha256", "-days", "2", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-set_serial", f"0x{uuid.uuid4().hex}", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=folder)
    (folder / f"{name}.csr").unlink()
    (folder / f"{name}.ext").unlink()


SERVER = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
CLIENT = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"


def make_certificates(folder: Path) -> Path:
    """``folder`` gets, each as ``<name>.pem`` with its ``<name>.key``:

    ca              the server's CA
    server          signed by ca, for IP:127.0.0.1 and DNS:localhost
    elsewhere       signed by ca, for DNS:db.example.net only (a certificate for another host)
    client          signed by ca, CN=app: a client certificate the server trusts
    other-ca        a second CA, unrelated to the server
    other-client    signed by other-ca: a client certificate the server does not trust
    """
    folder.mkdir(parents=True, exist_ok=True)
    _new_ca(folder, "ca")
    _new_ca(folder, "other-ca")
    _issue(folder, "server", "ca", "/CN=localhost", SERVER + "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _issue(folder, "elsewhere", "ca", "/CN=db.example.net", SERVER + "subjectAltName=DNS:db.example.net\n")
    _issue(folder, "client", "ca", "/CN=app", CLIENT)
    _issue(folder, "other-client", "other-ca", "/CN=app", CLIENT)
    for key in folder.glob("*.key"):
        key.chmod(0o600)
    return folder


# ------------------------------------------------------------------ server --

def _as_mysql() -> list[str]:
    # As root, mariadbd must be told to switch to its own user; as anybody else it runs as them.
    return ["--user=mysql"] if os.geteuid() == 0 else []


def _give_to_mysql(path: Path) -> None:
    if os.geteuid() != 0:
        return
    mysql = pwd.getpwnam("mysql")
    for item in [path, *path.rglob("*")]:
        os.chown(item, mysql.pw_uid, mysql.pw_gid)


def reap_leftovers() -> None:
    """SIGKILL servers an earlier session could not stop (its pytest was killed): only a pid
    whose command line still names its scratch folder, so a recycled pid is left alone."""
    for scratch in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*"):
        try:
            pid = int((scratch / "mariadbd.pid").read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            cmdline = ""
        if cmdline and str(scratch) in cmdline:
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists(), timeout=30, interval=0.05,
                     what=f"leftover mariadbd {pid} gone")
        shutil.rmtree(scratch, ignore_errors=True)


class MariaDbTls:
    """One mariadbd with TLS required, on a free port; ``certs`` is :func:`make_certificates`' folder."""

    def __init__(self, certs: Path) -> None:
        self.certs = certs
        self.port = free_port()
        self.scratch = Path(tempfile.gettempdir()) / f"{SCRATCH_PREFIX}{self.port}"
        self.datadir = self.scratch / "data"
        self.socket = self.scratch / "mysqld.sock"
        self.error_log = self.scratch / "error.log"
        self.proc: subprocess.Popen | None = None

    # -- life and death -------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> MariaDbTls:
        reap_leftovers()
        self.scratch.mkdir(parents=True)
        for name in ("ca.pem", "server.pem", "server.key"):
            shutil.copyfile(self.certs / name, self.scratch / name)
        _give_to_mysql(self.scratch)
        # A temporary folder of its own: bootstraps sharing /tmp collide on their temporary tables
        # ("Could not remove temporary table '/tmp/#sql-temptable-...'", then 1051: seen twice).
        (self.scratch / "tmp").mkdir()
        _give_to_mysql(self.scratch / "tmp")
        done = subprocess.run(["mariadb-install-db", "--no-defaults", *_as_mysql(), f"--datadir={self.datadir}",
                               f"--tmpdir={self.scratch / 'tmp'}", "--auth-root-authentication-method=normal",
                               "--skip-test-db"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise AssertionError(f"mariadb-install-db failed ({done.returncode}): {done.stderr[-2000:]}")
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(self._answers, timeout=timeout, interval=0.1, what="the TLS MariaDB answering")
            self._accounts()
        except BaseException as exc:
            log = self.log_tail()
            self.stop()
            raise AssertionError(f"the TLS MariaDB did not come up ({exc!r}):\n{log}") from exc
        return self

    def command(self) -> list[str]:
        return [MARIADBD, "--no-defaults", f"--datadir={self.datadir}", f"--port={self.port}",
                f"--socket={self.socket}", f"--tmpdir={self.scratch / 'tmp'}", "--bind-address=127.0.0.1", *_as_mysql(),
                f"--log-error={self.error_log}", f"--pid-file={self.scratch / 'mariadbd.pid'}",
                "--skip-name-resolve", "--innodb-buffer-pool-size=64M", "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_bin", f"--ssl-ca={self.scratch / 'ca.pem'}",
                f"--ssl-cert={self.scratch / 'server.pem'}", f"--ssl-key={self.scratch / 'server.key'}",
                "--require-secure-transport=ON"]

    def stop(self) -> None:
        """Kill the server and wait until it is gone, then remove its files."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(30)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        if not self.error_log.exists():
            return "(no error log)"
        return "\n".join(self.error_log.read_text(errors="replace").splitlines()[-lines:])

    # -- talking to it -----------------------------------------------------------------
    def root(self) -> pymysql.connections.Connection:
        """root over the server's socket (require_secure_transport exempts it)."""
        return pymysql.connect(unix_socket=str(self.socket), user="root", autocommit=True, connect_timeout=5,
                               database=None, cursorclass=pymysql.cursors.DictCursor)

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"mariadbd exited ({self.proc.returncode}):\n{self.log_tail()}")
        try:
            with closing(self.root()):
                return True
        except pymysql.MySQLError:
            return False

    def query(self, sql: str, *args) -> list[dict]:
        with closing(self.root()) as conn, conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def _accounts(self) -> None:
        with closing(self.root()) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{DATABASE}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
            cur.execute("CREATE USER 'app'@'%%' IDENTIFIED BY %s", (PASSWORDS["app"],))
            cur.execute("CREATE USER 'mtls'@'%%' IDENTIFIED BY %s REQUIRE X509", (PASSWORDS["mtls"],))
            for user in PASSWORDS:
                cur.execute(f"GRANT ALL PRIVILEGES ON `{DATABASE}`.* TO '{user}'@'%'")

    def url(self, user: str = "app", host: str = "127.0.0.1") -> str:
        return f"mysql+aiomysql://{user}:{PASSWORDS[user]}@{host}:{self.port}/{DATABASE}"

    def serve_certificate(self, name: str) -> None:
        """Make the server present ``<name>.pem`` (of :func:`make_certificates`) from its next connection on."""
        for suffix in ("pem", "key"):
            target = self.scratch / f"server.{suffix}"
            shutil.copyfile(self.certs / f"{name}.{suffix}", target)
            _give_to_mysql(target)
        with closing(self.root()) as conn, conn.cursor() as cur:
            cur.execute("FLUSH SSL")

    def tls_env(self, **certs: str | None) -> dict[str, str]:
        """MYSQL_SSL_* for a worker; ``certs`` names files of the certificate folder (``ca="other-ca"``)."""
        env = {}
        for setting, name in certs.items():
            if name is not None:
                env[f"MYSQL_SSL_{setting.upper()}"] = str(self.certs / (name if "." in name else f"{name}.pem"))
        return env
