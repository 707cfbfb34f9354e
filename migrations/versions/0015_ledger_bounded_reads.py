"""Bounded reads of the dead-letter ledger: the gauges' oldest row of each unsettled status is
the first entry of ``idx_group_status_first_failure``, and an order's dead letters (the newest
page, and a count that stops at its cap) are read from ``idx_order_group`` alone, without a row
lookup per letter. ``idx_order_group`` starts with ``order_no``, so it serves every read
``idx_order_no`` served.

Revision ID: 0015
Revises: 0014
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("idx_group_status_first_failure", "t_compensation",
                    ["consumer_group", "status", "first_failure_at"])
    op.create_index("idx_order_group", "t_compensation", ["order_no", "consumer_group"])
    op.drop_index("idx_order_no", "t_compensation")


def downgrade() -> None:
    op.create_index("idx_order_no", "t_compensation", ["order_no"])
    op.drop_index("idx_order_group", "t_compensation")
    op.drop_index("idx_group_status_first_failure", "t_compensation")
