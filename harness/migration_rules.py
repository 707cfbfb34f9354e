"""The migrations since the last release, and the rule each follows so that it runs while workers write.

The workers write nearly every table (``t_idem`` and ``t_order`` in every batch, the dead-letter
ledger, ``t_worker`` with every heartbeat), so the rule is for every table a migration changes:

* each ``ALTER TABLE`` (and ``CREATE INDEX``/``DROP INDEX``) on a table that exists names how it
  runs: ``ALGORITHM=INSTANT`` (no ``LOCK`` clause: MySQL 8 refuses one beside INSTANT), or
  ``ALGORITHM=INPLACE, LOCK=NONE``. The server refuses the statement when it cannot run so, instead
  of copying the table under a lock that stops every write: a test that runs it proves it.
* a migration that changes a table that exists is that one statement: a run that waited for the
  table's metadata lock in vain is tried again from the migration's start
  (``app.adapters.mysql.migration_locks``), which is safe only if nothing of it ran before.

``CREATE TABLE`` of a new table waits for no one. ``DROP``, ``RENAME`` and ``TRUNCATE`` of a table
that exists are refused: they take its lock whatever the algorithm, and they are contractions, which
wait one release anyway.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory
from packaging.version import Version
from sqlalchemy import event
from sqlalchemy.engine import Engine

from harness.releases import current_version, releases
from harness.services import ROOT

# A statement of interest: DDL and DML on the project's tables, not Alembic's bookkeeping.
_CHANGES = re.compile(r"^\s*(ALTER|CREATE|DROP|RENAME|TRUNCATE|INSERT|UPDATE|DELETE|REPLACE)\b", re.I)
_ALTER = re.compile(r"^\s*ALTER\s+(?:ONLINE\s+|IGNORE\s+)*TABLE\s+`?(\w+)`?", re.I)
_INDEX = re.compile(r"^\s*(?:CREATE\s+(?:UNIQUE\s+|FULLTEXT\s+|SPATIAL\s+)?|DROP\s+)INDEX\s+`?\w+`?\s+ON\s+`?(\w+)`?", re.I)
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?`?(\w+)`?", re.I)
_CONTRACTS = re.compile(r"^\s*(?:DROP\s+TABLE|RENAME\s+TABLE|TRUNCATE(?:\s+TABLE)?)\s+(?:IF\s+EXISTS\s+)?`?(\w+)`?", re.I)
_ALGORITHM = re.compile(r"\bALGORITHM(?:\s*=\s*|\s+)(DEFAULT|INSTANT|NOCOPY|INPLACE|COPY)\b", re.I)
_LOCK = re.compile(r"\bLOCK(?:\s*=\s*|\s+)(DEFAULT|NONE|SHARED|EXCLUSIVE)\b", re.I)


def script() -> ScriptDirectory:
    return ScriptDirectory.from_config(Config(str(ROOT / "alembic.ini")))


def first_release_commit() -> str:
    """The commit of the first release (``ops/releases.toml``): every migration since holds the online rule."""
    return releases()[0][1]


def previous_release_commit() -> str:
    """The commit of the newest release older than the current code (``ops/releases.toml``)."""
    now = Version(current_version())
    older = [(Version(v), c) for v, c in releases() if Version(v) < now]
    if not older:
        raise LookupError(f"ops/releases.toml lists no release older than {now}")
    return max(older)[1]


def since_release(commit: str | None = None) -> tuple[str, list[str]]:
    """``(base, revisions)``: the revision the release's schema is at, and every revision since,
    oldest first (those whose files the release's commit does not hold); the release is the first one
    unless ``commit`` names another: the online rule holds from there on."""
    commit = commit or first_release_commit()
    try:
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", commit, "migrations/versions/"],
                                check=True, capture_output=True, text=True).stdout.split()
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"commit {commit} is not in this clone's history ({exc.stderr.strip()}); fetch it "
                           "(git fetch --unshallow)") from None
    released = {Path(name).name for name in listed}
    chain = list(reversed(list(script().walk_revisions())))        # oldest first
    new = [rev for rev in chain if Path(rev.path).name not in released]
    if not new:
        return chain[-1].revision, []
    base = new[0].down_revision
    assert isinstance(base, str), f"revision {new[0].revision} does not follow exactly one revision"
    return base, [rev.revision for rev in new]


@contextmanager
def recorded_statements() -> Iterator[list[str]]:
    """Every statement that changes a table, as run (without error) by any SQLAlchemy engine of this process
    (the migrations' included) while the block runs; Alembic's own ``alembic_version`` left out."""
    seen: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        if _CHANGES.match(statement) and "alembic_version" not in statement:
            seen.append(" ".join(statement.split()))

    event.listen(Engine, "after_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "after_cursor_execute", record)


def changed_table(statement: str) -> str | None:
    """The existing table a DDL statement changes in place (None: a new table, or DML)."""
    found = _ALTER.match(statement) or _INDEX.match(statement)
    return found.group(1) if found else None


def _option(pattern: re.Pattern, statement: str) -> str:
    found = pattern.search(statement)
    return found.group(1).upper() if found else ""


def online_problems(revision: str, statements: list[str]) -> list[str]:
    """Why ``revision``'s ``statements`` would not run while workers write; empty when they would."""
    problems = []
    created = {found.group(1) for found in map(_CREATE_TABLE.match, statements) if found}
    changed = []
    for statement in statements:
        contraction = _CONTRACTS.match(statement)
        if contraction:
            problems.append(f"{revision}: {statement[:100]!r} locks {contraction.group(1)} whatever the algorithm "
                            "(and drops or renames what the previous release uses)")
            continue
        table = changed_table(statement)
        if table is None or table in created:
            continue
        changed.append(table)
        algorithm, lock = _option(_ALGORITHM, statement), _option(_LOCK, statement)
        if algorithm == "INSTANT" and lock not in ("", "DEFAULT"):
            problems.append(f"{revision}: {statement[:100]!r} says LOCK beside ALGORITHM=INSTANT, which MySQL 8 "
                            "refuses: say ALGORITHM=INSTANT alone")
        elif not (algorithm == "INSTANT" or algorithm == "INPLACE" and lock == "NONE"):
            problems.append(f"{revision}: {statement[:100]!r} does not say ALGORITHM=INSTANT or ALGORITHM=INPLACE, "
                            "LOCK=NONE: the server may copy the table under a lock that stops every write")
    if changed and len(statements) > 1:
        problems.append(f"{revision}: changes {', '.join(changed)} in {len(statements)} statements: a migration that "
                        "changes a table that exists is that one statement (a try that waited for the table's lock "
                        "in vain is run again from the migration's start)")
    return problems
