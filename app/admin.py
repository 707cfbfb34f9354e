"""Operator commands that need no running worker: ``python -m app.admin <command>``.

    python -m app.admin version          this release, the head of its migrations, the versions it runs on
    python -m app.admin migrate          migrate the database of MYSQL_URL to this release's schema
    python -m app.admin migrate --to R   ... to revision R (up or down; down only past expanding migrations)
    python -m app.admin migrate --sql    print the SQL instead of running it (a DBA runs it)
    python -m app.admin schema           the database's revision, the releases it serves, whether this one runs
    python -m app.admin create-topics    create order-event, order-event-dlq and the watermark topic

They read the same settings as the worker (the environment) and need only the ones they use: the
database's for ``migrate`` and ``schema``, Kafka's for ``create-topics``. The migrations are the
ones shipped with this release (the installed package's, or a checkout's ``migrations/``): no
``alembic.ini`` is needed.

Topics are created explicitly with their partition counts (the broker's auto-create is off, and so
is Faust's); an existing topic is left as it is, but a partition count that differs from the
setting is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import platform
import sys

from app.exits import EXIT_CONFIG, EXIT_UNAVAILABLE
from app.version import VERSION

PROG = "python -m app.admin"


def parser() -> argparse.ArgumentParser:
    """The commands and their options (the CLI reference, docs/cli.md, is held to it by a test)."""
    cli = argparse.ArgumentParser(prog=PROG, description="order-event-processor's operator commands")
    cli.add_argument("--version", action="version", version=f"order-event-processor {VERSION}")
    sub = cli.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="this release, the head of its migrations, the versions it runs on")
    migrate = sub.add_parser("migrate", help="migrate the database of MYSQL_URL to this release's schema")
    migrate.add_argument("--to", default="head", metavar="REVISION", help="the revision to reach (default: head)")
    migrate.add_argument("--sql", action="store_true", help="print the SQL instead of running it")
    sub.add_parser("schema", help="the database's revision, the releases it serves, whether this release runs on it")
    sub.add_parser("create-topics", help="create order-event, order-event-dlq and the watermark topic if missing")
    return cli


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return {"version": version, "migrate": migrate_database, "schema": schema_status,
            "create-topics": create_topics}[args.command](args)


def version(args) -> int:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    from app.adapters.mysql import schema

    print(f"order-event-processor {VERSION}")
    print(f"schema: revision {schema.revisions()[0]} (its migrations' head)")
    parts = [f"Python {platform.python_version()}"]
    for package in ("faust-streaming", "aiokafka", "SQLAlchemy", "aiomysql"):
        try:
            parts.append(f"{package} {installed(package)}")
        except PackageNotFoundError:
            parts.append(f"{package} missing")
    print("runs on: " + ", ".join(parts))
    return 0


def migrate_database(args) -> int:
    from alembic import command
    from alembic.util import CommandError

    from app.adapters.mysql import schema
    from app.settings import get_settings_or_exit

    settings = get_settings_or_exit()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("alembic").setLevel(logging.INFO)
    config = schema.alembic_config(settings.database.url, settings.database.sql_mode)
    before = None if args.sql else _revision(settings)
    try:
        if args.to == "head" or before is None or args.to in _above(before):
            command.upgrade(config, args.to, sql=args.sql)
        else:
            command.downgrade(config, args.to, sql=args.sql)
    except CommandError as exc:
        print(f"{PROG} migrate: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if not args.sql:
        after = _revision(settings)
        print(f"the database's schema is at revision {after} (was {before or 'none'}); "
              f"{_serves(settings)}", file=sys.stderr)
    return 0


def _above(revision: str) -> list[str]:
    """The revisions newer than ``revision`` (the code's, head first)."""
    from app.adapters.mysql import schema

    known = schema.revisions()
    return known[:known.index(revision)] if revision in known else []


def schema_status(args) -> int:
    from app.adapters.mysql import schema
    from app.settings import get_settings_or_exit

    settings = get_settings_or_exit()
    found = asyncio.run(_found(settings))
    known = schema.revisions()
    print(f"the database's schema: revision {found.revision or 'none'}; "
          + (f"serves release {found.oldest_release} and later" if found.oldest_release else
             "says nothing of the releases it serves (older than t_schema_release)"))
    verdict = schema.judge_revision(found, known)
    print(f"release {VERSION} (its migrations' head: {known[0]}): "
          + ("runs on it" + (f" ({verdict.message})" if verdict.message else "") if verdict.ok else
             f"does not run on it: {verdict.message}"))
    return 0 if verdict.ok else EXIT_CONFIG


def _revision(settings) -> str | None:
    return asyncio.run(_found(settings)).revision


def _serves(settings) -> str:
    oldest = asyncio.run(_found(settings)).oldest_release
    return f"it serves release {oldest} and later" if oldest else "it says nothing of the releases it serves"


async def _found(settings):
    from app.adapters.mysql import schema
    from app.adapters.mysql.engine import create_engine
    from app.adapters.mysql.preflight import Target, explain
    from app.adapters.mysql.tls import MySqlTls

    engine = create_engine(settings, pool_size=1, max_overflow=0)
    try:
        return await schema.found_schema(engine)
    except Exception as exc:            # unreachable, refused: one sentence that names the setting to fix
        why = explain(exc, MySqlTls.from_settings(settings.database), Target.of(settings.database.url))
        raise SystemExit(f"{PROG}: cannot use the database: {why}") from None
    finally:
        await engine.dispose()


def create_topics(args) -> int:
    from app.adapters.kafka import ops as kafka_ops
    from app.adapters.kafka.connection import KafkaConfigError, KafkaConnection, KafkaStartupError, preflight
    from app.adapters.kafka.topics import topic_specs
    from app.settings import get_settings_or_exit

    settings = get_settings_or_exit()
    try:
        asyncio.run(preflight(KafkaConnection.from_settings(settings.kafka), wait_seconds=settings.kafka.startup_wait_seconds))
    except (KafkaStartupError, KafkaConfigError) as exc:
        print(f"{PROG}: cannot reach Kafka: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE if getattr(exc, "retriable", False) else EXIT_CONFIG
    for line in asyncio.run(kafka_ops.create_topics(KafkaConnection.from_settings(settings.kafka), topic_specs(settings))):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
