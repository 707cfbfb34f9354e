"""When each step's first call that may have reached its provider began (``t_idem.first_call_at``):
a provider keeps an idempotency key for a while only (``keys_kept_for``), and a step whose first
call is older than that is asked about, or left to a person, never repeated blindly.

Expands the schema only: one nullable column at the end of ``t_idem``, no default, no index, no
row rewritten.

Online: ``ALGORITHM=INSTANT`` (and no ``LOCK`` clause, which MySQL 8 refuses beside it): only the
table's definition changes, whatever the table holds, on MariaDB 10.3+ and MySQL 8.0.12+ (at the end
of the table, as here, which MySQL before 8.0.29 requires), the monthly partitions of ``t_idem``
included. Measured on MariaDB 10.11, a partitioned ``t_idem`` of 10 million rows with two workers
writing: ``docs/benchmarks.md``, "A migration under load"; partition maintenance (``REORGANIZE`` and
``DROP PARTITION``) works on the table after it. It takes ``t_idem``'s metadata lock exclusively for
those milliseconds, once (measured: a ``lock_wait_timeout`` of 1 s gives up after 1.0 s); before
that it waits for every transaction open on ``t_idem`` to end, and the workers' statements that come
meanwhile wait behind it, for at most ``MIGRATION_LOCK_WAIT_SECONDS`` (2 s): then it gives up and the
run is tried again (``migrations/env.py``). A server that cannot add the column instantly refuses
the statement and changes nothing, rather than rebuilding the table: MariaDB before 10.3, or with
``innodb_instant_alter_column_allowed=never``; MySQL before 8.0.12, or 8.0.29+ on a table that has
used its 64 instant row versions (``INFORMATION_SCHEMA.INNODB_TABLES.TOTAL_ROW_VERSIONS``); a
``ROW_FORMAT=COMPRESSED`` table. There, rebuild ``t_idem`` online first (``ALTER TABLE t_idem FORCE,
ALGORITHM=INPLACE, LOCK=NONE``, which also resets MySQL's row versions) or use a tool that copies it
online (``docs/mariadb-and-mysql8.md``, "Changing the schema while workers write"), then run this again.

The downgrade drops the column: instant on MariaDB 10.4+ and MySQL 8.0.29+, a rebuild that permits
writes (``INPLACE``) on MySQL before 8.0.29.

Release N-1 runs on this schema: its inserts leave the column NULL, which this release reads as
the row's creation (earlier than any call of it, so a key's age errs long: a lookup or a person,
never a blind repeat).

Revision ID: 0019
Revises: 0018
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

OLDEST_RELEASE_SERVED = None    # expands only: every release the schema served before, it serves still


def upgrade() -> None:
    op.execute("ALTER TABLE t_idem ADD COLUMN first_call_at DATETIME(3) NULL COMMENT "
               "'when the first claim whose call may have reached the provider began; NULL: none did yet', "
               "ALGORITHM=INSTANT")


def downgrade() -> None:
    op.execute("ALTER TABLE t_idem DROP COLUMN first_call_at")
