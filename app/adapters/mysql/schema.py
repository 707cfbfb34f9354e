"""Whether the database's schema is one this release runs on, and the migrations that make it so.

The schema's revision is Alembic's (``alembic_version``); the code's is the head of the
``migrations`` package shipped with it (in a checkout, the repository's ``migrations/``; installed,
the wheel's: no ``alembic.ini`` is needed, :func:`alembic_config`). The rule every release keeps:

* a release's migrations only expand the schema (tables, columns with defaults or NULL, indexes),
  so that the previous release's workers run on it during a rolling upgrade; a contraction (a
  column dropped, renamed or narrowed) waits one release, and moves the oldest release the schema
  serves (each migration's ``OLDEST_RELEASE_SERVED``; ``t_schema_release`` holds the result);
* a worker runs on a schema at its own head, or on a newer one that still serves its release, and
  refuses any other at start-up (exit 78) with what to run or which releases fit:
  :func:`judge_revision`.

A worker started on a schema its migrations have not reached would fail each batch that touches a
newer table or column (a dead letter per event, ``internal_error``); one started on a schema that
no longer serves it would write what a newer release no longer reads.
"""

from __future__ import annotations

import importlib.util
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.version import VERSION

MIGRATE = "python -m app.admin migrate"       # what a person runs, from the release they start


def migrations_dir() -> Path:
    """The folder of the ``migrations`` package shipped with this code."""
    spec = importlib.util.find_spec("migrations")
    if spec is None or not spec.submodule_search_locations:
        raise LookupError("the migrations package is not installed with this code")
    return Path(next(iter(spec.submodule_search_locations)))


def alembic_config(url: str | None = None, sql_mode: str | None = None):
    """Alembic's configuration for this code's migrations, without an ``alembic.ini``: the URL and
    the sql_mode as ``-x`` arguments (``migrations/env.py`` reads them, else the settings)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("path_separator", "os")
    config.cmd_opts = Namespace(x=[f"url={url}"] * bool(url) + [f"sql_mode={sql_mode}"] * bool(sql_mode))
    return config


def revisions() -> list[str]:
    """The code's revisions, head first."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    return [rev.revision for rev in script.walk_revisions()]


@dataclass(frozen=True, slots=True)
class FoundSchema:
    """What a database says of its schema: its revision (None: never migrated) and the oldest release
    it serves (None: a schema older than ``t_schema_release``)."""

    revision: str | None
    oldest_release: str | None = None


@dataclass(frozen=True, slots=True)
class RevisionVerdict:
    ok: bool
    message: str = ""


def judge_revision(found: FoundSchema | str | None, known: list[str], version: str = VERSION) -> RevisionVerdict:
    """Whether release ``version``, whose migrations are ``known`` (head first), runs on ``found``."""
    if not isinstance(found, FoundSchema):
        found = FoundSchema(found)
    head = known[0]
    if found.revision == head:
        return RevisionVerdict(True)
    if found.revision is None:
        return RevisionVerdict(False, f"the database has no schema yet (no alembic_version); release {version} needs "
                                      f"revision {head}: run `{MIGRATE}` from this release first")
    if found.revision in known:
        return RevisionVerdict(False, f"the database's schema is at revision {found.revision}, release {version} needs "
                                      f"{head}: run `{MIGRATE}` from this release before starting it (its migrations "
                                      "only expand the schema: the workers of the release before keep running)")
    serves = found.oldest_release
    if serves is None:
        return RevisionVerdict(False, f"the database's schema is at revision {found.revision}, which release {version} "
                                      f"does not know (its newest is {head}), and it does not say which releases it "
                                      "serves (no t_schema_release): run the release that migrated it")
    if _older(version, serves):
        return RevisionVerdict(False, f"the database's schema is at revision {found.revision} and serves release "
                                      f"{serves} and later; this worker is release {version}: run release {serves} "
                                      "or later (a rollback past a contracting migration needs the schema moved "
                                      "back first: the upgrade guide)")
    return RevisionVerdict(True, f"the database's schema is at revision {found.revision}, newer than release "
                                 f"{version}'s {head}, and serves release {serves} and later: going on (a rolling "
                                 "upgrade, or a rollback)")


def _older(version: str, than: str) -> bool:
    try:
        return Version(version) < Version(than)
    except InvalidVersion:
        return True             # a version nobody can compare is no version the schema promised to serve


async def found_schema(engine: AsyncEngine) -> FoundSchema:
    async with engine.connect() as conn:
        try:
            revision = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
        except Exception as exc:
            if "1146" in str(exc):          # no alembic_version: never migrated
                return FoundSchema(None)
            raise
        try:
            oldest = (await conn.execute(text("SELECT oldest_release FROM t_schema_release WHERE id = 1"))).scalar()
        except Exception as exc:
            if "1146" in str(exc):          # a schema older than t_schema_release (release 1.0.0's)
                return FoundSchema(revision)
            raise
        return FoundSchema(revision, oldest)


async def found_revision(engine: AsyncEngine) -> str | None:
    return (await found_schema(engine)).revision
