"""The reconcile's runs (``t_reconcile_run``): over which range of the input, who ran it, how every
record ended and what was found, for the console and for the next person who asks.

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME, MEDIUMTEXT

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

NOW3 = sa.text("CURRENT_TIMESTAMP(3)")
TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "t_reconcile_run",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("topic", sa.String(249), nullable=False),
        sa.Column("range_from", DATETIME(fsp=3), nullable=False, comment="records at or after (their timestamps, UTC)"),
        sa.Column("range_to", DATETIME(fsp=3), nullable=False, comment="records before"),
        sa.Column("started_by", sa.String(128), nullable=False, comment="timer:<worker>, cli:<who>"),
        sa.Column("started_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("finished_at", DATETIME(fsp=3), nullable=True),
        sa.Column("status", sa.String(16), nullable=False, comment="running, clean, findings, failed"),
        sa.Column("records", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("findings", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("summary", sa.String(1024), nullable=True, comment="the findings by kind, JSON: what the gauges read"),
        sa.Column("report", MEDIUMTEXT, nullable=True, comment="the report as JSON (its first findings)"),
        sa.Index("idx_group_id", "consumer_group", "id"),
        **TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("t_reconcile_run")
