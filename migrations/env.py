"""Alembic environment: migrations run synchronously through PyMySQL.

The URL comes from the ``MYSQL_URL`` setting (``-x url=...`` overrides it, which
the tests use to migrate a scratch database), the session's sql_mode from
``DB_SQL_MODE`` (``-x sql_mode=...`` overrides it), as the worker's sessions have it;
TLS from ``MYSQL_SSL_*``, like every other connection of the project
(``app.adapters.mysql.engine.ssl_context``). A connection the server refuses ends the run with one
sentence that names the setting to fix.

Every statement waits for a table's metadata lock at most ``MIGRATION_LOCK_WAIT_SECONDS``
(``-x lock_wait_seconds=...``), so that an ``ALTER TABLE`` waiting behind a long transaction never
holds the workers' statements queued behind it for longer; a run that gave up is tried again from
the migration that waited, ``MIGRATION_LOCK_TRIES`` times (``-x lock_tries=...``):
``app.adapters.mysql.migration_locks``.
"""

from logging.config import fileConfig

from alembic import context
from alembic.util import CommandError
from sqlalchemy import create_engine, pool
from sqlalchemy.exc import DBAPIError

from app.adapters.mysql.engine import session_sql_mode, ssl_context
from app.adapters.mysql.migration_locks import LockNotGranted, LockWaits, open_transactions
from app.adapters.mysql.preflight import Target, explain
from app.adapters.mysql.tls import MySqlTls
from app.settings import get_settings
from tables import metadata

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def sync_url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or get_settings().database.url
    return url.replace("+aiomysql", "+pymysql")


def lock_waits() -> LockWaits:
    given = context.get_x_argument(as_dictionary=True)
    configured = LockWaits.from_settings(get_settings().database)
    return LockWaits(int(given.get("lock_wait_seconds", configured.wait_seconds)),
                     int(given.get("lock_tries", configured.tries)))


def connect_args(waits: LockWaits) -> dict:
    mode = context.get_x_argument(as_dictionary=True).get("sql_mode") or get_settings().database.sql_mode
    assignments = [session_sql_mode(mode), waits.session_assignment()]
    return {"init_command": "SET SESSION " + ", ".join(a for a in assignments if a)}


def run_migrations_offline() -> None:
    context.configure(url=sync_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    settings = get_settings()
    tls = ssl_context(settings)
    waits = lock_waits()
    engine = create_engine(sync_url(), poolclass=pool.NullPool,
                           connect_args={**connect_args(waits), **({"ssl": tls} if tls else {})})

    def once() -> None:
        try:
            connection = engine.connect()
        except DBAPIError as exc:
            # alembic prints a CommandError as "FAILED: <message>" and exits 1, without a traceback.
            raise CommandError(f"cannot migrate: {explain(exc, MySqlTls.from_settings(settings.database), Target.of(sync_url()))}") from None
        with connection:
            context.configure(connection=connection, target_metadata=metadata)
            with context.begin_transaction():
                context.run_migrations()

    def holders() -> str:
        try:
            with engine.connect() as connection:
                return open_transactions(connection, waits.wait_seconds)
        except DBAPIError:
            return ""

    try:
        waits.run(once, holders=holders)
    except LockNotGranted as exc:
        raise CommandError(f"cannot migrate: {exc}") from None
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
