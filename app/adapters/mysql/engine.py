"""The database engine, configured once for every adapter."""

from __future__ import annotations

import logging
import math
import re
import socket
import ssl

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import app.adapters.mysql.recovery as recovery
from app.adapters.mysql.tls import MySqlTls
from app.settings import Settings

log = logging.getLogger(__name__)
CHARSET = "utf8mb4"
_SQL_MODE = re.compile(r"[A-Za-z_]+(,[A-Za-z_]+)*")
_KEEP_BACKSLASH_ESCAPES = ("sql_mode = TRIM(BOTH ',' FROM REPLACE(CONCAT(',', @@SESSION.sql_mode, ','), "
                           "',NO_BACKSLASH_ESCAPES,', ','))")


class WrongCharset(RuntimeError):
    """A connection came up with a character set other than utf8mb4."""


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of every database connection the project opens (the worker's engine, the
    CLI, Alembic, the benchmarks, the tests' own PyMySQL connections), from ``MYSQL_SSL_*``; None
    without TLS. A driver given one refuses a server that offers no TLS instead of falling back
    to plaintext (``app.adapters.mysql.tls``)."""
    return MySqlTls.from_settings(settings.database).ssl_context()


def create_engine(settings: Settings, *, url: str | None = None, pool_size: int | None = None,
                  max_overflow: int | None = None, remembered: recovery.Remembered | None = None) -> AsyncEngine:
    """An aiomysql engine in READ COMMITTED (locking reads lock rows, never gaps),
    with the session clock in UTC (every DATETIME column holds UTC) and utf8mb4.

    Every new connection gets TCP keepalive probes after ``DB_KEEPALIVE_SECONDS``
    of silence, so a connection whose peer vanished (a half-open TCP connection)
    is found dead in about a minute instead of the kernel's two hours; the
    statements themselves are bounded by the store's client-side timeouts.
    With ``MYSQL_SSL_*`` every connection is TLS (:func:`ssl_context`), checked against
    ``url``'s host when the host name is verified.

    The other side of the same failure: a worker cut off in the middle of a
    transaction leaves its row locks on the server until the server drops the
    connection. The session's ``wait_timeout`` (twice the transaction timeout,
    at least 60 s) makes the server roll such a transaction back within a
    minute or two instead of eight hours; pooled connections are recycled
    before the server would close them for being idle.

    Each new connection also checks that the store is still the one this process knows
    (``DB_SERVER_CHECK``): the same server, and not back in time below ``remembered``.
    """
    size = settings.database.pool_size if pool_size is None else pool_size
    server_idle = max(60, math.ceil(2 * settings.database.transaction_timeout_seconds))
    tls = ssl_context(settings)
    sql_mode = session_sql_mode(settings.database.sql_mode)
    engine = create_async_engine(
        url or settings.database.url,
        pool_size=size,
        max_overflow=size if max_overflow is None else max_overflow,
        pool_timeout=settings.database.pool_timeout_seconds,
        pool_recycle=server_idle // 2,
        isolation_level="READ COMMITTED",
        connect_args={"charset": CHARSET,
                      "connect_timeout": settings.database.connect_timeout_seconds,
                      "init_command": "SET SESSION time_zone = '+00:00', "
                                      f"innodb_lock_wait_timeout = {int(settings.database.lock_wait_timeout_seconds)}, "
                                      f"lock_wait_timeout = 30, wait_timeout = {server_idle}, {sql_mode}",
                      **({"ssl": tls} if tls is not None else {})},
    )
    keepalive = settings.database.keepalive_seconds
    server_check = settings.database.server_check

    @event.listens_for(engine.sync_engine, "connect")
    def on_connect(dbapi_connection, connection_record) -> None:
        _set_keepalive(dbapi_connection, keepalive)
        check_charset(dbapi_connection)
        if server_check:
            check_store_server(dbapi_connection, settings, remembered)

    return engine


def check_store_server(dbapi_connection, settings: Settings, remembered: recovery.Remembered | None = None) -> None:
    """Open a recovery window when this connection reached another server than the store last
    recorded, or a store whose watermark is below the one this process knows it reached
    (``app.adapters.mysql.recovery``); say so in the log and the metrics."""
    change = recovery.check_server(dbapi_connection, worker_id=settings.worker_id, hours=settings.database.recovery_auto_hours,
                                   remembered=remembered.value if remembered is not None else 0)
    if change is not None:
        recovery.report(change)


def session_sql_mode(mode: str | None) -> str:
    """The assignment that gives a session its sql_mode: the modes ``DB_SQL_MODE`` names, or
    the server's own without NO_BACKSLASH_ESCAPES. aiomysql escapes bytes parameters with
    backslashes whatever the mode, so under that mode a record's bytes would be stored
    altered, or a quote among them would end their literal early (the docs, "MariaDB and MySQL 8")."""
    if not mode:
        return _KEEP_BACKSLASH_ESCAPES
    if not _SQL_MODE.fullmatch(mode):
        raise ValueError(f"DB_SQL_MODE={mode!r}: not a comma-separated list of sql_mode names")
    if "NO_BACKSLASH_ESCAPES" in mode.upper().split(","):
        raise ValueError("DB_SQL_MODE must not hold NO_BACKSLASH_ESCAPES: the driver escapes bytes with backslashes")
    return f"sql_mode = '{mode}'"


def check_charset(dbapi_connection) -> None:
    """Refuse a connection whose session does not speak utf8mb4 both ways."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SELECT @@character_set_client, @@character_set_connection, @@character_set_results")
        found = cursor.fetchone()
    finally:
        cursor.close()
    if any(value != CHARSET for value in found):
        raise WrongCharset(
            f"the database session uses character sets client/connection/results = {'/'.join(map(str, found))}, "
            f"not {CHARSET}; check the server's init_connect and character_set_* settings")


def _set_keepalive(dbapi_connection, idle_seconds: int) -> None:
    writer = getattr(getattr(dbapi_connection, "_connection", None), "_writer", None)
    sock = writer.transport.get_extra_info("socket") if writer is not None else None
    if sock is None:
        log.warning("no socket found on a new database connection; TCP keepalive not set")
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", idle_seconds), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
