"""Which releases the schema serves (``t_schema_release``): one row, the schema's revision and the
oldest release whose workers run on it. A worker of an older release refuses the schema (exit 78,
and which releases fit), one of a release the schema still serves runs on it though it is newer
than the worker's own migrations: a rolling upgrade runs release N-1 and N in one group on N's
schema.

Every migration from this one on says whether it moves that oldest release
(``OLDEST_RELEASE_SERVED``: None when it only expands the schema, so that the previous release
keeps working; a version when it contracts, which waits one release: the changelog says so).
``migrations/env.py`` writes the row after every upgrade or downgrade that ends at or past this
revision.

Expands the schema only: a new table of one row. No lock on any table the workers write.

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

# From this revision on, the schema serves release 1.0.0 and later (1.0.0's migrations end at 0018,
# and every migration since only expands).
OLDEST_RELEASE_SERVED = "1.0.0"

TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "t_schema_release",
        sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False, comment="always 1"),
        sa.Column("revision", sa.String(32), nullable=False, comment="the schema's revision (alembic_version)"),
        sa.Column("oldest_release", sa.String(32), nullable=False,
                  comment="the oldest release whose workers run on this schema"),
        sa.Column("migrated_by", sa.String(32), nullable=False, comment="the release whose migrate command wrote it"),
        sa.Column("migrated_at", DATETIME(fsp=3), nullable=False, server_default=sa.text("CURRENT_TIMESTAMP(3)")),
        **TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("t_schema_release")
