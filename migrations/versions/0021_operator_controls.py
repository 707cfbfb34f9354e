"""Operator controls (``t_effect_hold``, ``t_partition_pause``, their history in
``t_control_audit``): a person holds an effect across the whole group (a provider's maintenance) or
pauses one partition of the input, with a reason; every worker reads them every few seconds.

Expands the schema only: three new tables. No lock on a table the workers write; the release before
this one never reads them (its workers run on this schema and ignore holds and pauses: finish a
rolling upgrade before holding anything).

Revision ID: 0021
Revises: 0020
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

OLDEST_RELEASE_SERVED = None    # expands only: every release the schema served before, it serves still

NOW3 = sa.text("CURRENT_TIMESTAMP(3)")
TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "t_effect_hold",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("effect", sa.String(32), nullable=False),
        sa.Column("starts_at", DATETIME(fsp=3), nullable=False, comment="held from (UTC)"),
        sa.Column("ends_at", DATETIME(fsp=3), nullable=False,
                  comment="its planned end (UTC): the hold ends then by itself if auto_release, else a person ends it"),
        sa.Column("auto_release", sa.Boolean, nullable=False, comment="1: ends at ends_at by itself"),
        sa.Column("reason", sa.String(1024), nullable=False),
        sa.Column("held_by", sa.String(128), nullable=False),
        sa.Column("created_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("released_at", DATETIME(fsp=3), nullable=True),
        sa.Column("released_by", sa.String(128), nullable=True),
        sa.Column("release_note", sa.String(1024), nullable=True),
        # the holds not released of a group, read by every worker every few seconds
        sa.Index("idx_group_released", "consumer_group", "released_at", "effect"),
        **TABLE_ARGS,
    )
    op.create_table(
        "t_partition_pause",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("topic", sa.String(249), nullable=False),
        sa.Column("partition_no", sa.Integer, nullable=False),
        sa.Column("reason", sa.String(1024), nullable=False),
        sa.Column("paused_by", sa.String(128), nullable=False),
        sa.Column("paused_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("resumed_at", DATETIME(fsp=3), nullable=True),
        sa.Column("resumed_by", sa.String(128), nullable=True),
        sa.Column("resume_note", sa.String(1024), nullable=True),
        sa.Index("idx_group_resumed", "consumer_group", "resumed_at", "topic", "partition_no"),
        **TABLE_ARGS,
    )
    op.create_table(
        "t_control_audit",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("actor", sa.String(128), nullable=False, comment="web:<who>, cli:<who>"),
        sa.Column("action", sa.String(16), nullable=False, comment="hold, release, pause, resume"),
        sa.Column("target", sa.String(300), nullable=False, comment="the effect, or topic:partition"),
        sa.Column("control_id", sa.BigInteger, nullable=False, comment="t_effect_hold.id or t_partition_pause.id"),
        sa.Column("note", sa.String(1024), nullable=True),
        sa.Index("idx_group_at", "consumer_group", "at"),
        **TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("t_control_audit")
    op.drop_table("t_partition_pause")
    op.drop_table("t_effect_hold")
