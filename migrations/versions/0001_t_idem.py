"""t_idem: the idempotency state machine table (one row per step of an event).

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

NOW3 = sa.text("CURRENT_TIMESTAMP(3)")


def upgrade() -> None:
    op.create_table(
        "t_idem",
        sa.Column("biz_key", sa.String(128), primary_key=True),
        sa.Column("status", sa.SmallInteger, nullable=False, comment="1 pending, 2 done, 3 failed"),
        sa.Column("attempt", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("last_err", sa.String(512), nullable=True),
        sa.Column("idem_token", sa.String(64), nullable=True),
        sa.Column("owner", sa.String(128), nullable=True),
        sa.Column("gmt_create", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("gmt_modified", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index("idx_status_modified", "t_idem", ["status", "gmt_modified"])


def downgrade() -> None:
    op.drop_table("t_idem")
