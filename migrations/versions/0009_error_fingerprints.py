"""Error groups: each dead letter's fingerprint (``t_compensation.fingerprint``), with the
indexes that list a group and count a group's inflow over time.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("t_compensation", sa.Column(
        "fingerprint", sa.String(16), nullable=True,
        comment="the error group: a hash of the reason, the effect, the service's status or error class "
                "and the normalised message"))
    op.create_index("idx_group_fingerprint", "t_compensation", ["consumer_group", "fingerprint", "id"])
    op.create_index("idx_group_first_failure", "t_compensation", ["consumer_group", "first_failure_at"])


def downgrade() -> None:
    op.drop_index("idx_group_first_failure", "t_compensation")
    op.drop_index("idx_group_fingerprint", "t_compensation")
    op.drop_column("t_compensation", "fingerprint")
