"""t_compensation: the ledger of dead-lettered records.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

NOW3 = sa.text("CURRENT_TIMESTAMP(3)")


def upgrade() -> None:
    op.create_table(
        "t_compensation",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("src_topic", sa.String(249), nullable=False),
        sa.Column("src_partition", sa.Integer, nullable=False),
        sa.Column("src_offset", sa.BigInteger, nullable=False),
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("order_no", sa.String(64), nullable=True),
        sa.Column("event_id", sa.String(64), nullable=True),
        sa.Column("biz_key", sa.String(128), nullable=True),
        sa.Column("status", sa.SmallInteger, nullable=False,
                  comment="1 open, 2 retrying, 3 compensated, 4 manual, 5 discarded"),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", sa.String(1024), nullable=True),
        sa.Column("retriable", sa.Boolean, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_retry_at", DATETIME(fsp=3), nullable=True),
        sa.Column("may_be_superseded", sa.Boolean, nullable=False, server_default=sa.text("0"),
                  comment="later events of the same order ran after this one"),
        sa.Column("worker_id", sa.String(128), nullable=True),
        sa.Column("first_failure_at", DATETIME(fsp=3), nullable=False),
        sa.Column("gmt_create", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("gmt_modified", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.UniqueConstraint("src_topic", "src_partition", "src_offset", name="uk_source"),
        mysql_engine="InnoDB", mysql_charset="utf8mb4", mysql_collate="utf8mb4_bin",
    )
    op.create_index("idx_status_next_retry", "t_compensation", ["status", "next_retry_at"])
    op.create_index("idx_order_no", "t_compensation", ["order_no"])


def downgrade() -> None:
    op.drop_table("t_compensation")
