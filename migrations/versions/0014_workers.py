"""The workers' heartbeats (``t_worker``): a claim whose owner no longer beats is taken over at
the owner's presumed death, not at its lease's end.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

NOW3 = sa.text("CURRENT_TIMESTAMP(3)")
TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "t_worker",
        sa.Column("incarnation", sa.String(160), primary_key=True,
                  comment="<worker_id>/<run>: one process, from its start to its end; the owners of its claims"),
        sa.Column("worker_id", sa.String(64), nullable=False),
        sa.Column("started_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("last_seen", DATETIME(fsp=3), nullable=False, server_default=NOW3,
                  comment="its last heartbeat, the database clock"),
        sa.Column("stopped_at", DATETIME(fsp=3), nullable=True,
                  comment="set by a clean stop: it calls nothing more, its claims are free at once"),
        sa.Index("idx_last_seen", "last_seen"),
        **TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("t_worker")
