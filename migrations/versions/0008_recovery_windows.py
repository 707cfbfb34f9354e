"""Recovery windows (``t_recovery_window``) and the database server the store last saw
(``t_store_server``): after a failover or a restore from backup, fresh claims of an SMS are
looked up before they are sent.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

NOW3 = sa.text("CURRENT_TIMESTAMP(3)")
TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "t_recovery_window",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("opened_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("ends_at", DATETIME(fsp=3), nullable=False),
        sa.Column("opened_by", sa.String(128), nullable=False,
                  comment="cli:<who>, or worker:<id> for a server change"),
        sa.Column("reason", sa.String(1024), nullable=False,
                  comment="why: what the person wrote, or the server change seen"),
        sa.Column("ended_at", DATETIME(fsp=3), nullable=True, comment="set when ended before ends_at"),
        sa.Column("ended_by", sa.String(128), nullable=True),
        sa.Column("end_note", sa.String(1024), nullable=True),
        **TABLE_ARGS,
    )
    op.create_index("idx_ends_at", "t_recovery_window", ["ends_at"])
    op.create_table(
        "t_store_server",
        sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("server", sa.String(255), nullable=False, comment="server_uuid, or host:port#server_id"),
        sa.Column("gmt_modified", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        **TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("t_store_server")
    op.drop_table("t_recovery_window")
