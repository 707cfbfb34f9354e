"""Whether the database's schema is the one this code was written for.

The schema's revision is Alembic's (``alembic_version``); the code's is the head of
``migrations/``. A worker started on a database its migrations have not reached would fail
each batch that touches a newer table or column (a dead letter per event, ``internal_error``),
so it refuses to start and says what to run. A database *ahead* of the code (a newer release
migrated it during a rolling deploy) is let through with a warning: every migration adds, so
older code keeps working on a newer schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

# Beside the code (a checkout), else in the folder the worker runs from (the image's /srv).
ALEMBIC_INI = Path(__file__).resolve().parents[3] / "alembic.ini"


def alembic_ini() -> Path:
    return ALEMBIC_INI if ALEMBIC_INI.is_file() else Path.cwd() / "alembic.ini"


@dataclass(frozen=True, slots=True)
class RevisionVerdict:
    ok: bool
    message: str = ""


def revisions(ini: Path | None = None) -> list[str] | None:
    """The code's revisions, head first; None when the migrations are not shipped beside it."""
    ini = ini or alembic_ini()
    if not ini.is_file():
        return None
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(Config(str(ini)))
    return [rev.revision for rev in script.walk_revisions()]


def judge_revision(found: str | None, known: list[str]) -> RevisionVerdict:
    """``found``: the database's revision (None: never migrated); ``known``: the code's, head first."""
    head = known[0]
    if found == head:
        return RevisionVerdict(True)
    if found is None:
        return RevisionVerdict(False, f"the database has no schema yet (no alembic_version); this code needs revision "
                              f"{head}: run `alembic upgrade head` (make migrate) first")
    if found in known:
        return RevisionVerdict(False, f"the database's schema is at revision {found}, this code needs {head}: run "
                              "`alembic upgrade head` (make migrate) before starting it")
    return RevisionVerdict(True, f"the database's schema is at revision {found}, which this code does not know (its "
                         f"newest is {head}): a newer release migrated it; going on, as every migration adds")


async def found_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        try:
            result = await conn.execute(text("SELECT version_num FROM alembic_version"))
        except Exception as exc:
            if "1146" in str(exc):          # no alembic_version: never migrated
                return None
            raise
        return result.scalar()
