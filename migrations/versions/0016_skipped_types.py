"""Records of types this processor does not handle, skipped and counted per type
(``t_skipped_type``): what an upstream publishes that no step reads, for a person to see.

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

NOW3 = sa.text("CURRENT_TIMESTAMP(3)")
TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "t_skipped_type",
        sa.Column("consumer_group", sa.String(255), primary_key=True),
        sa.Column("event_type", sa.String(64), primary_key=True,
                  comment="as the record names it; `other` past 100 a worker"),
        sa.Column("skipped", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("first_seen", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("last_seen", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("last_topic", sa.String(249), nullable=True, comment="where the latest one is"),
        sa.Column("last_partition", sa.Integer, nullable=True),
        sa.Column("last_offset", sa.BigInteger, nullable=True),
        **TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("t_skipped_type")
