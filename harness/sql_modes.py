"""The session sql_modes the SQL tests run under: the server's own (MariaDB's default here)
and MySQL 8's default, set on MariaDB per session (``DB_SQL_MODE``), since MySQL 8 itself
cannot run here. What MySQL 8's mode adds to MariaDB's: ONLY_FULL_GROUP_BY, NO_ZERO_DATE,
NO_ZERO_IN_DATE (and it has no NO_AUTO_CREATE_USER, which MySQL 8 refuses).

A module runs its database tests under each mode with::

    settings, scratch_db = sql_modes.each_sql_mode()

Every test of it that uses ``settings`` or ``scratch_db`` (``harness``, ``spawn_worker`` and
the module's own fixtures included) runs once per mode, ids ``[server]`` and ``[mysql8]``;
``@sql_modes.server_only`` keeps one test to the server's mode (a test whose subject is
not the SQL, and that is slow).
"""

from __future__ import annotations

import pytest

MYSQL8_DEFAULT = ("ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
                  "NO_ENGINE_SUBSTITUTION")
# None: DB_SQL_MODE as the environment has it (unset: the server's default).
SQL_MODES: dict[str, str | None] = {"server": None, "mysql8": MYSQL8_DEFAULT}

server_only = pytest.mark.parametrize("settings", ["server"], indirect=True)


def each_sql_mode():
    """Module-level ``settings`` and ``scratch_db`` fixtures, one of each per sql_mode. They are
    module-scoped (a module's fixtures that use them may be too) and take the session's: the
    databases come from ``scratch_dbs``, made once per mode for every module that asks."""

    @pytest.fixture(scope="module", params=list(SQL_MODES))
    def settings(request, settings):
        mode = SQL_MODES[request.param]
        return settings if mode is None else settings.model_copy(update={"db_sql_mode": mode})

    @pytest.fixture(scope="module")
    def scratch_db(settings, scratch_dbs):
        return scratch_dbs.get(settings)

    return settings, scratch_db
