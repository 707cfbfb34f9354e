"""The audit of unmasked views (``t_view_audit``): who saw personal data whole, as what role,
what, and when.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

NOW3 = sa.text("CURRENT_TIMESTAMP(3)")
TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "t_view_audit",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("consumer_group", sa.String(255), nullable=False, comment="the app whose data was seen"),
        sa.Column("actor", sa.String(128), nullable=False, comment="web:<X-Actor>, cli:<--actor>"),
        sa.Column("role", sa.String(16), nullable=False, comment="operator"),
        sa.Column("what", sa.String(32), nullable=False,
                  comment="dead_letter, timeline, download:value, download:envelope"),
        sa.Column("path", sa.String(512), nullable=False, comment="the path asked, or the CLI command"),
        sa.Column("compensation_id", sa.BigInteger, nullable=True),
        sa.Column("order_no", sa.String(64), nullable=True),
        **TABLE_ARGS,
    )
    op.create_index("idx_group_id", "t_view_audit", ["consumer_group", "id"])


def downgrade() -> None:
    op.drop_table("t_view_audit")
