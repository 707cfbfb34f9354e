"""The SQL the code sends (every string in ``app/``, ``migrations/`` and ``tables/`` that is no
docstring) uses no form that only one of MariaDB and MySQL 8 accepts. The tests run on
MariaDB alone, so a MySQL-only form would pass them and fail in ``docker-compose.yml``'s
MySQL 8; a MariaDB-only one would pass them and fail there too. The docs page "MariaDB and
MySQL 8" lists the forms the code uses where the two differ, and why each works on both."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from app.adapters.mysql.engine import session_sql_mode
from tables import metadata

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*sorted((ROOT / "app").rglob("*.py")), *sorted((ROOT / "migrations").rglob("*.py")),
           *sorted((ROOT / "tables").rglob("*.py"))]

# form -> (the server that accepts it alone, what both accept instead)
ONE_SERVER_ONLY = {
    # MySQL 8 only
    r"\)\s+AS\s+\w+(\s*\([^)]*\))?\s+ON\s+DUPLICATE\s+KEY": ("MySQL 8.0.19+ (row alias)", "VALUES(col)"),
    r"(?i)\bmax_execution_time\b|MAX_EXECUTION_TIME\(": ("MySQL (SELECT only)", "the store's client-side timeouts"),
    r"(?i)@@server_uuid": ("MySQL", "@@server_id, @@hostname"),
    r"(?i)\binformation_schema_stats_expiry\b": ("MySQL", "ANALYZE TABLE"),
    r"(?i)\butf8mb4_0900_\w+": ("MySQL 8", "utf8mb4_bin"),
    r"\w+\s*->>?\s*'\$": ("MySQL (JSON path operators)", "JSON_EXTRACT / JSON_UNQUOTE"),
    r"\bFOR\s+SHARE\b": ("MySQL 8", "LOCK IN SHARE MODE"),
    r"(?i)\bperformance_schema\.data_locks\b": ("MySQL 8", "information_schema.INNODB_TRX"),
    r"(?i)\bsql_require_primary_key\b": ("MySQL 8.0.13+", "a primary key on every table"),
    r"\bSET\s+PERSIST\b": ("MySQL 8", "the server's configuration file"),
    # MariaDB only
    r"\bRETURNING\b": ("MariaDB 10.5+", "a SELECT after the write"),
    r"(?i)\bmax_statement_time\b": ("MariaDB", "the store's client-side timeouts"),
    r"\bCREATE\s+OR\s+REPLACE\s+TABLE\b": ("MariaDB", "DROP TABLE IF EXISTS, then CREATE TABLE"),
    r"\b(ADD|DROP)\s+(COLUMN\s+|INDEX\s+|KEY\s+|PARTITION\s+|CONSTRAINT\s+)?IF\s+(NOT\s+)?EXISTS\b":
        ("MariaDB", "a migration that knows the schema"),
    r"\bCREATE\s+(UNIQUE\s+)?INDEX\s+IF\s+NOT\s+EXISTS\b": ("MariaDB", "a migration that knows the schema"),
    r"\bFOR\s+UPDATE\s+WAIT\s+\d": ("MariaDB", "NOWAIT, SKIP LOCKED or innodb_lock_wait_timeout"),
    r"(?i)\butf8mb4_uca1400_\w+": ("MariaDB 10.10+", "utf8mb4_bin"),
    r"(?i)\bSIMULTANEOUS_ASSIGNMENT\b|\bEMPTY_STRING_IS_NULL\b|\bTIME_ROUND_FRACTIONAL\b":
        ("MariaDB (sql_mode)", "the modes both servers have"),
    r"(?i)\bNO_AUTO_CREATE_USER\b": ("MariaDB (MySQL 8 refuses the mode)", "MySQL 8's default modes"),
    r"\bEXPLAIN\s+(PARTITIONS|EXTENDED)\b": ("MariaDB (MySQL 8.0 removed them)", "EXPLAIN"),
    r"\bROWS\s+EXAMINED\b": ("MariaDB", "LIMIT"),
    r"(?i)\binnodb_snapshot_isolation\b": ("MariaDB 10.6.18+", "READ COMMITTED and locking reads"),
    r"(?i)@@(session\.|global\.)?tx_isolation\b|\btx_read_only\b": ("MariaDB (MySQL 8.0 removed it)",
                                                                   "transaction_isolation, via SQLAlchemy"),
    r"(?i)\bquery_cache_\w+|\bSQL_CACHE\b|\bSQL_NO_CACHE\b": ("MariaDB (MySQL 8.0 removed the cache)", "nothing"),
    r"\bseq_\d+_to_": ("MariaDB (the SEQUENCE engine)", "a recursive CTE"),
    r"\bVALUE\(": ("MariaDB (VALUES() alias)", "VALUES(col)"),
    r"\bGROUP\s+BY\s+[\w, ]+\s+(ASC|DESC)\b": ("MariaDB (MySQL 8.0.13 removed it)", "ORDER BY"),
}
PATTERNS = {re.compile(pattern): why for pattern, why in ONE_SERVER_ONLY.items()}
SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|ALTER|CREATE|SET|SHOW|EXPLAIN|DROP)\b")

# The words MySQL 8.0 reserved anew (MySQL 8.0 reference, "Keywords and Reserved Words"):
# as a table or column name each would need quoting there, and nothing here quotes names.
MYSQL8_RESERVED = {"cube", "cume_dist", "dense_rank", "empty", "except", "first_value", "function", "grouping",
                   "groups", "json_table", "lag", "last_value", "lateral", "lead", "nth_value", "ntile", "of",
                   "over", "percent_rank", "rank", "recursive", "row", "rows", "row_number", "system", "window"}


def strings(path: Path) -> list[str]:
    """Every string of ``path`` that is no docstring; an f-string whole, ``{}`` for each value."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            skip.add(id(node.body[0].value))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in node.values)
            found.append("".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found.append(node.value)
    return found


def single_server_forms(texts: list[str]) -> list[tuple[str, str]]:
    return [(match.group(0), why[0]) for text in texts if SQL.search(text)
            for pattern, why in PATTERNS.items() for match in [pattern.search(text)] if match]


def test_the_code_sends_no_sql_only_one_server_accepts():
    texts = [text for path in SOURCES for text in strings(path)]
    statements = [text for text in texts if SQL.search(text)]
    assert len(statements) > 50, "the scan found too little SQL to be checking anything"
    assert any("ON DUPLICATE KEY UPDATE" in text for text in statements)       # f-strings are read whole
    assert single_server_forms(texts) == []


@pytest.mark.parametrize("sample, server", [
    ("INSERT INTO t (a) VALUES (%s) AS new ON DUPLICATE KEY UPDATE a = new.a", "MySQL 8.0.19+ (row alias)"),
    ("INSERT INTO t (a) VALUES (1) AS new(x) ON DUPLICATE KEY UPDATE a = x", "MySQL 8.0.19+ (row alias)"),
    ("DELETE FROM t_lease WHERE name = %s RETURNING owner", "MariaDB 10.5+"),
    ("SET SESSION max_statement_time = 5", "MariaDB"),
    ("SELECT /*+ MAX_EXECUTION_TIME(5000) */ 1", "MySQL (SELECT only)"),
    ("SELECT id FROM t_compensation FOR UPDATE WAIT 2", "MariaDB"),
    ("ALTER TABLE t_idem ADD COLUMN IF NOT EXISTS x INT", "MariaDB"),
    ("EXPLAIN PARTITIONS SELECT 1 FROM t_idem", "MariaDB (MySQL 8.0 removed them)"),
    ("SET SESSION sql_mode = 'STRICT_TRANS_TABLES,NO_AUTO_CREATE_USER'", "MariaDB (MySQL 8 refuses the mode)"),
    ("SELECT doc->>'$.a' FROM t", "MySQL (JSON path operators)"),
    ("SELECT owner FROM t_lease WHERE name = %s FOR SHARE", "MySQL 8"),
])
def test_a_form_only_one_server_accepts_is_caught(sample, server):
    assert [found for _, found in single_server_forms([sample])] == [server]


@pytest.mark.parametrize("sample", [
    "INSERT INTO t_lease (name) VALUES (%s) ON DUPLICATE KEY UPDATE owner = IF(x, VALUES(owner), owner)",
    "SELECT id FROM t_compensation WHERE status = 1 ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED",
    "SET SESSION time_zone = '+00:00', innodb_lock_wait_timeout = 10, lock_wait_timeout = 30, wait_timeout = 60",
    "ALTER TABLE t_idem REORGANIZE PARTITION p_future INTO (PARTITION p_future VALUES LESS THAN (MAXVALUE))",
    "SELECT reason, COUNT(*) AS n FROM (SELECT reason FROM t_compensation LIMIT 10) AS u GROUP BY reason",
    "CREATE TABLE t (a INT) DEFAULT CHARSET=utf8mb4 COLLATE utf8mb4_bin",
])
def test_the_forms_the_code_uses_pass(sample):
    assert single_server_forms([sample]) == []


def test_no_table_or_column_is_named_by_a_word_mysql_8_reserves():
    names = {table.name for table in metadata.tables.values()} | {
        column.name for table in metadata.tables.values() for column in table.columns}
    assert names & MYSQL8_RESERVED == set()


def test_db_sql_mode_is_set_as_given_and_the_servers_is_kept_without_no_backslash_escapes():
    assert session_sql_mode("ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES") == \
        "sql_mode = 'ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES'"
    assert session_sql_mode(None) == session_sql_mode("") and "@@SESSION.sql_mode" in session_sql_mode(None)
    with pytest.raises(ValueError, match="not a comma-separated list"):
        session_sql_mode("STRICT_TRANS_TABLES'; DROP TABLE t_idem; --")
    with pytest.raises(ValueError, match="NO_BACKSLASH_ESCAPES"):
        session_sql_mode("STRICT_TRANS_TABLES,no_backslash_escapes")
