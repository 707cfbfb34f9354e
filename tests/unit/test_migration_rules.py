"""The rule a migration follows to run while workers write, read from its statements."""

from __future__ import annotations

from harness.migration_rules import online_problems

INSTANT = "ALTER TABLE t_idem ADD COLUMN first_call_at DATETIME(3) NULL COMMENT 'x', ALGORITHM=INSTANT"


def test_instant_alone_and_inplace_without_lock_pass():
    assert online_problems("r", [INSTANT]) == []
    assert online_problems("r", ["ALTER TABLE t_compensation ADD INDEX i (a), ALGORITHM = INPLACE, LOCK = NONE"]) == []
    assert online_problems("r", ["CREATE INDEX i ON t_order (a) ALGORITHM=INPLACE LOCK=NONE"]) == []


def test_a_new_table_and_its_indexes_wait_for_no_one():
    assert online_problems("r", ["CREATE TABLE t_new (a INT)", "CREATE INDEX ix ON t_new (a)"]) == []


def test_a_change_that_does_not_say_how_it_runs_is_refused():
    for statement in ("ALTER TABLE t_idem ADD COLUMN lock_until_x INT",           # a column named like the clause
                      "ALTER TABLE t_idem MODIFY attempt BIGINT, ALGORITHM=INPLACE",   # may lock writes out
                      "ALTER TABLE t_idem MODIFY attempt BIGINT, ALGORITHM=COPY, LOCK=SHARED",
                      "CREATE INDEX i ON t_compensation (a)"):
        [problem] = online_problems("r", [statement])
        assert "does not say ALGORITHM=INSTANT or ALGORITHM=INPLACE, LOCK=NONE" in problem


def test_lock_beside_instant_is_refused_because_mysql_8_refuses_it():
    [problem] = online_problems("r", [INSTANT + ", LOCK=NONE"])
    assert "MySQL 8 refuses" in problem


def test_a_change_of_a_table_that_exists_is_its_migrations_only_statement():
    [problem] = online_problems("r", ["CREATE TABLE t_new (a INT)", INSTANT])
    assert "changes t_idem in 2 statements" in problem


def test_drops_renames_and_truncates_of_tables_that_exist_are_refused():
    for statement in ("DROP TABLE t_idem", "RENAME TABLE t_idem TO t_old", "TRUNCATE TABLE t_order"):
        [problem] = online_problems("r", [statement])
        assert "whatever the algorithm" in problem
