"""Every table and column the MySQL adapter's SQL names exists in ``tables/``, so a rename
there cannot silently break a statement here (the statements are written out by hand,
for one round trip per table and batch)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from app.pipeline.states import ORDER_DATA
from tables import metadata

ADAPTER = Path(__file__).resolve().parents[2] / "app" / "adapters" / "mysql"
SQL_WORDS = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|WHERE|SET|VALUES|FROM|AND|IN|IF|ON)\b")
IDENTIFIER = re.compile(r"(?<![%'\w])[a-z_][a-z0-9_]*\b")
KNOWN = {table.name for table in metadata.tables.values()} | {
    column.name for table in metadata.tables.values() for column in table.columns}
# The server's own names (its columns there are upper case, which the scan does not read), and
# Alembic's table of the schema's revision (app.adapters.mysql.schema reads it).
SERVER = {"information_schema", "lock_wait_timeout", "alembic_version", "version_num"}
# The connection's modules (the engine, TLS, the first connection): session settings and the
# server's answers in words, no statement of a table.
CONNECTION = {"engine.py", "tls.py", "preflight.py"}


def sql_fragments(path: Path) -> list[str]:
    """String constants (f-string parts included) that are SQL, not docstrings or messages."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and SQL_WORDS.search(node.value)]


ALIAS = re.compile(r"\bAS\s+([a-z_][a-z0-9_]*)")


def unknown_names(fragments: list[str]) -> set[str]:
    """Lower-case names that are no table, no column, and no alias the SQL names itself (``AS n``)."""
    aliases = {alias for fragment in fragments for alias in ALIAS.findall(fragment)}
    return {name for fragment in fragments for name in IDENTIFIER.findall(fragment)} - KNOWN - SERVER - aliases


def test_every_name_in_the_adapters_sql_is_a_table_or_column():
    fragments = [f for path in sorted(ADAPTER.glob("*.py")) if path.name not in CONNECTION for f in sql_fragments(path)]
    assert len(fragments) > 30, "the scan found too little SQL to be checking anything"
    assert unknown_names(fragments) == set()


def test_the_order_columns_written_from_the_model_exist():
    assert set(ORDER_DATA) <= {column.name for column in metadata.tables["t_order"].columns}


def test_a_renamed_column_is_caught():
    assert unknown_names(["UPDATE t_idem SET statuz = %s WHERE biz_key = %s"]) == {"statuz"}
    assert unknown_names(["SELECT biz_key FROM t_idemm WHERE status = 1"]) == {"t_idemm"}
