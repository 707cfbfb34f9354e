"""t_idem partitioned by month on part_date (the date inside the order number).

Partitions: ``p_before`` (every date before the first month), one ``pYYYYMM`` per
month from twelve months back to three months ahead of the day the migration runs,
and ``p_future`` (MAXVALUE, a catch-all that stays empty while the maintenance timer
keeps months ready ahead). The primary key (biz_key, part_date) already holds the
partitioning column, as every unique key of a partitioned table must.

Converting a table that already holds rows copies it (MariaDB and MySQL rebuild it),
and writes wait while it runs: on a large table, run it in a quiet hour.

Revision ID: 0006
Revises: 0005
"""

from datetime import UTC, date, datetime

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

MONTHS_BACK = 12
MONTHS_AHEAD = 3


def _month(start: date, months: int) -> date:
    index = start.year * 12 + start.month - 1 + months
    return date(index // 12, index % 12 + 1, 1)


def upgrade() -> None:
    this_month = datetime.now(UTC).date().replace(day=1)
    first = _month(this_month, -MONTHS_BACK)
    parts = [f"PARTITION p_before VALUES LESS THAN ('{first.isoformat()}')"]
    for i in range(MONTHS_BACK + MONTHS_AHEAD + 1):
        month = _month(first, i)
        parts.append(f"PARTITION p{month:%Y%m} VALUES LESS THAN ('{_month(month, 1).isoformat()}')")
    parts.append("PARTITION p_future VALUES LESS THAN (MAXVALUE)")
    op.execute("ALTER TABLE t_idem PARTITION BY RANGE COLUMNS(part_date) (\n  " + ",\n  ".join(parts) + ")")


def downgrade() -> None:
    op.execute("ALTER TABLE t_idem REMOVE PARTITIONING")
