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
from sqlalchemy import create_engine, pool, text
from sqlalchemy.exc import DBAPIError

from app.adapters.mysql.engine import session_sql_mode, ssl_context
from app.adapters.mysql.migration_locks import LockNotGranted, LockWaits, open_transactions
from app.adapters.mysql.preflight import Target, explain
from app.adapters.mysql.tls import MySqlTls
from app.settings import get_settings
from app.version import VERSION
from tables import metadata

# The revision that created t_schema_release; from there on every run writes its row.
SCHEMA_RELEASE_SINCE = "0020"

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
            context.configure(connection=connection, target_metadata=metadata,
                              on_version_apply=lambda ctx, step, heads, run_args: write_schema_release(
                                  connection, next(iter(heads), None)))
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


def write_schema_release(connection, current: str | None) -> None:
    """After each migration (up or down): ``t_schema_release`` says the revision the schema is at and
    the oldest release it serves, the newest ``OLDEST_RELEASE_SERVED`` a migration up to that revision
    declares (None: it moves nothing). Written with the revision, so a run that stops between two
    migrations leaves both true."""
    script = context.get_context().script
    if current is None or script is None:
        return
    walked = list(script.iterate_revisions(current, "base"))
    if SCHEMA_RELEASE_SINCE not in {rev.revision for rev in walked}:
        return                          # below the table's own migration: nothing to write to
    oldest = next(declared for rev in walked
                  if (declared := getattr(rev.module, "OLDEST_RELEASE_SERVED", None)) is not None)
    connection.execute(text(
        "INSERT INTO t_schema_release (id, revision, oldest_release, migrated_by, migrated_at) "
        "VALUES (1, :revision, :oldest, :by, CURRENT_TIMESTAMP(3)) ON DUPLICATE KEY UPDATE "
        "revision = VALUES(revision), oldest_release = VALUES(oldest_release), migrated_by = VALUES(migrated_by), "
        "migrated_at = VALUES(migrated_at)"), {"revision": current, "oldest": oldest, "by": VERSION})


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
