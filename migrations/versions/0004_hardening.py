"""Hardening: the ledger is unique per consumer group and source record (its timestamp
included: a topic created again reuses offsets), says which dead letters went out
truncated, and orders remember that they have dead letters waiting for their next move.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("t_compensation", sa.Column("src_timestamp", sa.BigInteger, nullable=False,
                                              server_default=sa.text("-1"),
                                              comment="the record's timestamp in ms, -1 if it had none"))
    op.add_column("t_compensation", sa.Column("truncated", sa.Boolean, nullable=False, server_default=sa.text("0"),
                                              comment="the dead-letter record carries only the start of the original"))
    op.drop_constraint("uk_source", "t_compensation", type_="unique")
    op.create_unique_constraint("uk_source", "t_compensation",
                                ["consumer_group", "src_topic", "src_partition", "src_offset", "src_timestamp"])
    op.add_column("t_order", sa.Column("has_dead_letters", sa.Boolean, nullable=False, server_default=sa.text("0"),
                                       comment="a dead letter of this order awaits the order's next move"))


def downgrade() -> None:
    op.drop_column("t_order", "has_dead_letters")
    op.drop_constraint("uk_source", "t_compensation", type_="unique")
    op.create_unique_constraint("uk_source", "t_compensation", ["src_topic", "src_partition", "src_offset"])
    op.drop_column("t_compensation", "truncated")
    op.drop_column("t_compensation", "src_timestamp")
