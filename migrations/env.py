"""Alembic environment: migrations run synchronously through PyMySQL.

The URL comes from the ``MYSQL_URL`` setting (``-x url=...`` overrides it, which
the tests use to migrate a scratch database), the session's sql_mode from
``DB_SQL_MODE`` (``-x sql_mode=...`` overrides it), as the worker's sessions have it;
TLS from ``MYSQL_SSL_*``, like every other connection of the project
(``app.adapters.mysql.engine.ssl_context``). A connection the server refuses ends the run with one
sentence that names the setting to fix.
"""

from logging.config import fileConfig

from alembic import context
from alembic.util import CommandError
from sqlalchemy import create_engine, pool
from sqlalchemy.exc import DBAPIError

from app.adapters.mysql.engine import session_sql_mode, ssl_context
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


def connect_args() -> dict:
    mode = context.get_x_argument(as_dictionary=True).get("sql_mode") or get_settings().database.sql_mode
    return {"init_command": f"SET SESSION {session_sql_mode(mode)}"}


def run_migrations_offline() -> None:
    context.configure(url=sync_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    settings = get_settings()
    tls = ssl_context(settings)
    engine = create_engine(sync_url(), poolclass=pool.NullPool,
                           connect_args={**connect_args(), **({"ssl": tls} if tls else {})})
    try:
        connection = engine.connect()
    except DBAPIError as exc:
        # alembic prints a CommandError as "FAILED: <message>" and exits 1, without a traceback.
        raise CommandError(f"cannot migrate: {explain(exc, MySqlTls.from_settings(settings.database), Target.of(sync_url()))}") from None
    with connection:
        context.configure(connection=connection, target_metadata=metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
