"""The store's watermark (``t_store_server.watermark``): how far the database has come, advanced by
the workers and also kept on Kafka, so that a store that went back in time (a restore from backup
into the same server) is noticed and opens a recovery window by itself.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("t_store_server", sa.Column(
        "watermark", sa.BigInteger, nullable=False, server_default=sa.text("0"),
        comment="advanced by every worker and published to the watermark topic; lower than what Kafka "
                "remembers: the store went back in time"))


def downgrade() -> None:
    op.drop_column("t_store_server", "watermark")
