"""The database (MariaDB or MySQL): where it is, how its connections are secured and bounded, and
how the store notices a failover or a restore.

The TLS rules (``MYSQL_SSL_*`` that contradict each other, files that cannot be read or do not
load) live here, as :func:`check_tls` and :func:`tls_context`: the settings refuse them, and
``app.adapters.mysql.tls.MySqlTls`` applies the same rules and hands the drivers the context.
"""

from __future__ import annotations

import os
import ssl
from typing import Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import field_validator, model_validator

from app.settings._base import Group, setting

TLS_MODES: tuple[str, ...] = ("disabled", "required", "verify")


def _no_passphrase() -> str:
    raise ValueError("MYSQL_SSL_KEY is an encrypted private key: give it unencrypted "
                     "(openssl pkey -in KEY -out KEY.plain)")


def tls_context(mode: str, ca: str | None, cert: str | None, key: str | None,
                verify_identity: bool) -> ssl.SSLContext:
    """The context of an enabled mode; ValueError naming the settings when a file does not load."""
    if mode == "required":
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        try:
            context = ssl.create_default_context(cafile=ca)
        except ssl.SSLError as exc:
            raise ValueError(f"MYSQL_SSL_CA could not be loaded ({exc.reason or exc}): it must be a "
                             "PEM file of CA certificates") from None
        context.check_hostname = verify_identity
    if cert:
        try:
            context.load_cert_chain(cert, key, password=_no_passphrase)
        except ssl.SSLError as exc:
            raise ValueError(f"MYSQL_SSL_CERT and MYSQL_SSL_KEY could not be loaded ({exc.reason or exc}):"
                             " they must be PEM files, the key unencrypted and matching the certificate") from None
    return context


def check_tls(mode: str, ca: str | None, cert: str | None, key: str | None, verify_identity: bool) -> None:
    """Refuse TLS settings that cannot work, naming the settings (never their values): ValueError."""
    if mode not in TLS_MODES:
        raise ValueError(f"MYSQL_SSL_MODE must be one of {', '.join(TLS_MODES)}")
    if (cert is None) != (key is None):
        raise ValueError("MYSQL_SSL_CERT and MYSQL_SSL_KEY go together (a client certificate and "
                         "its private key, for mTLS): set both or neither")
    if mode == "disabled" and (ca or cert):
        raise ValueError("MYSQL_SSL_MODE=disabled, but MYSQL_SSL_CA, MYSQL_SSL_CERT or MYSQL_SSL_KEY "
                         "is set: unset them, or set MYSQL_SSL_MODE to verify (or leave it unset)")
    if mode == "required" and ca:
        raise ValueError("MYSQL_SSL_MODE=required encrypts without checking the server's certificate, "
                         "so MYSQL_SSL_CA would be ignored: set MYSQL_SSL_MODE=verify (or leave it unset)")
    for name, path in (("MYSQL_SSL_CA", ca), ("MYSQL_SSL_CERT", cert), ("MYSQL_SSL_KEY", key)):
        if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            raise ValueError(f"{name} names no readable file")
    if mode != "disabled":
        tls_context(mode, ca, cert, key, verify_identity)     # PEM files that do not load are refused here


class DatabaseSettings(Group):
    TITLE = "Database"

    url: str = setting("MYSQL_URL", "mysql+aiomysql://idem:idem@127.0.0.1:3306/idem",
        description='The database; every connection is `utf8mb4` (a URL asking for another `charset` is refused at '
                    'start-up, and a session that comes up in another character set is refused at connect).')

    ssl_mode: Literal["disabled", "required", "verify"] | None = setting("MYSQL_SSL_MODE", None, shown='unset: `verify` when `MYSQL_SSL_CA` or `MYSQL_SSL_CERT` is set, else `disabled`',
        description='TLS for every database connection of the project: `disabled`; `required` (encrypted, the '
                    "server's certificate not checked); `verify` (checked against `MYSQL_SSL_CA`, or the system's CAs"
                    ' when it is unset) ([TLS to the database](connecting.md#tls-to-the-database)).')

    ssl_ca: str | None = setting("MYSQL_SSL_CA", None, shown="unset: the system's CAs",
        description="PEM file of the CA(s) that signed the database server's certificate.")

    ssl_cert: str | None = setting("MYSQL_SSL_CERT", None,
        description="mTLS: PEM file of this client's certificate (with `MYSQL_SSL_KEY`), for an account `REQUIRE "
                    'X509`.')

    ssl_key: str | None = setting("MYSQL_SSL_KEY", None,
        description='mTLS: PEM file of its private key (unencrypted).')

    ssl_verify_identity: bool = setting("MYSQL_SSL_VERIFY_IDENTITY", True,
        description="With `verify`: check that the server's certificate names the host of `MYSQL_URL`; `false` checks"
                    ' the CA only.')

    pool_size: int = setting("DB_POOL_SIZE", 4, ge=1,
        description='Connections per worker (as many again may overflow); the heartbeat has its own besides: one, '
                    'and up to `WORKER_DEAD_AFTER_SECONDS` / `WORKER_HEARTBEAT_SECONDS` (8 at most) while beats are '
                    'slow to land.')

    pool_timeout_seconds: float = setting("DB_POOL_TIMEOUT_SECONDS", 10.0, gt=0,
        description='How long a transaction waits for a free pooled connection; then it is an infrastructure wait.')

    connect_timeout_seconds: float = setting("DB_CONNECT_TIMEOUT_SECONDS", 5.0, gt=0,
        description='TCP connect timeout of a new connection.')

    statement_timeout_seconds: float = setting("DB_STATEMENT_TIMEOUT_SECONDS", 15.0, gt=0,
        description='Client-side bound of one statement (must exceed `DB_LOCK_WAIT_TIMEOUT_SECONDS`); a statement '
                    'that runs over is an infrastructure failure and its connection is discarded.')

    transaction_timeout_seconds: float = setting("DB_TRANSACTION_TIMEOUT_SECONDS", 30.0, gt=0,
        description="Client-side bound of one transaction, connection checkout included; the session's `wait_timeout`"
                    ' is twice this (at least 60 s), so the server rolls back a transaction whose worker vanished.')

    keepalive_seconds: int = setting("DB_KEEPALIVE_SECONDS", 30, ge=1,
        description='TCP keepalive idle time of database connections (then a probe every 10 s, 3 probes).')

    lock_retries: int = setting("DB_LOCK_RETRIES", 5, ge=0,
        description='Re-runs of a transaction after a deadlock or lock-wait timeout.')

    lock_wait_timeout_seconds: int = setting("DB_LOCK_WAIT_TIMEOUT_SECONDS", 10, ge=1,
        description="`innodb_lock_wait_timeout` of the worker's sessions.")

    migration_lock_wait_seconds: int = setting("MIGRATION_LOCK_WAIT_SECONDS", 2, ge=0, le=3600,
        description="The longest one wait of a migration for a table's metadata lock may hold the workers' "
                    'statements on that table up (`lock_wait_timeout` of the migration\'s session): an `ALTER '
                    "TABLE` waits for every transaction open on its table, and everything after it on that table "
                    'waits behind it. Then it gives up, the run pauses twice as long and is tried again '
                    '([Migrating under load](operations.md#migrating-under-load)). Keep it under '
                    '`DB_STATEMENT_TIMEOUT_SECONDS`; 0: the server\'s `lock_wait_timeout` (a day on MariaDB, a year '
                    'on MySQL 8), for a maintenance window.')

    migration_lock_tries: int = setting("MIGRATION_LOCK_TRIES", 20, ge=1,
        description='How many times a migration run waits for a metadata lock in vain before it stops (exit 1, '
                    'naming the transactions that held the table open); each try that gave up changed nothing.')

    sql_mode: str | None = setting("DB_SQL_MODE", None, pattern=r"^([A-Za-z_]+(,[A-Za-z_]+)*)?$",
        description="The `sql_mode` of every database session (the worker's, the CLI's, the migrations'), "
                    "comma-separated modes: the tests set MySQL 8's default this way on MariaDB ([MariaDB and MySQL "
                    "8](mariadb-and-mysql8.md)); unset or empty: the server's default. `NO_BACKSLASH_ESCAPES` is "
                    "refused here and taken out of the server's default: the driver escapes bytes with backslashes "
                    "whatever the mode, so under it a record's bytes would be stored altered, or a quote among them "
                    'would end their literal.')

    infra_retry_budget_seconds: float = setting("INFRA_RETRY_BUDGET_SECONDS", 60.0, gt=0,
        description='How long (wall clock, however many records wait at once) a batch waits out an unreachable '
                    'database before the worker stops.')

    server_check: bool = setting("DB_SERVER_CHECK", True,
        description='Each new database connection compares the server it reached with the one the store last recorded'
                    " (`t_store_server`), and the store's watermark with the highest this worker knows it reached; "
                    'another server (a replica promoted by a failover, a server rebuilt from a backup), or a store '
                    'back in time (a restore into the same server), opens a recovery window ([After a failover or a '
                    'restore](operations.md#after-a-failover-or-a-restore)).')

    store_watermark_seconds: float = setting("STORE_WATERMARK_SECONDS", 10.0, gt=0,
        description="How often every worker advances the store's watermark in the database, publishes it, and "
                    'compares the store with what Kafka remembers; a clean stop advances it once more. A watermark '
                    'topic that cannot be opened is tried again every 6 advances (a minute by default).')

    recovery_auto_hours: float = setting("RECOVERY_AUTO_HOURS", 24.0, gt=0, le=2160,
        description='How long a recovery window a worker opened by itself lasts (a server change, a store back in '
                    'time; a person ends it earlier with `faust -A app recovery end`).')

    @field_validator("ssl_mode", mode="before")
    @classmethod
    def _mode_in_any_case(cls, value):
        return value.strip().lower() or None if isinstance(value, str) else value

    @property
    def tls_mode(self) -> str:
        """MYSQL_SSL_MODE; unset: ``verify`` when a CA or a client certificate is given, else ``disabled``."""
        if self.ssl_mode is not None:
            return self.ssl_mode
        return "verify" if self.ssl_ca or self.ssl_cert or self.ssl_key else "disabled"

    @model_validator(mode="after")
    def _check(self) -> DatabaseSettings:
        charsets = parse_qs(urlsplit(self.url).query).get("charset", [])
        if any(charset.lower() != "utf8mb4" for charset in charsets):
            raise ValueError(
                f"MYSQL_URL asks for charset={','.join(charsets)}; the processor needs utf8mb4 (order data is "
                "arbitrary Unicode, and a narrower connection charset silently mangles it). Remove the charset "
                "parameter or set it to utf8mb4.")
        if self.statement_timeout_seconds <= self.lock_wait_timeout_seconds:
            raise ValueError(
                f"DB_STATEMENT_TIMEOUT_SECONDS={self.statement_timeout_seconds:g} must exceed "
                f"DB_LOCK_WAIT_TIMEOUT_SECONDS={self.lock_wait_timeout_seconds}: a statement waiting for a "
                "row lock would be cut off before the server reports the lock wait")
        if self.transaction_timeout_seconds < self.statement_timeout_seconds:
            raise ValueError(
                f"DB_TRANSACTION_TIMEOUT_SECONDS={self.transaction_timeout_seconds:g} must be at least "
                f"DB_STATEMENT_TIMEOUT_SECONDS={self.statement_timeout_seconds:g}")
        check_tls(self.tls_mode, self.ssl_ca or None, self.ssl_cert or None, self.ssl_key or None,
                  self.ssl_verify_identity)
        return self
