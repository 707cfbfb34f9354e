"""Bulk actions on the dead-letter queue: jobs (``t_bulk_job``), the ledger rows each one took
(``t_bulk_item``), and the job behind each audit line (``t_compensation_audit.job_id``).

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

NOW3 = sa.text("CURRENT_TIMESTAMP(3)")
TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.add_column("t_compensation_audit", sa.Column(
        "job_id", sa.BigInteger, nullable=True, comment="the bulk job (t_bulk_job) that did it, if one did"))
    op.create_index("idx_job", "t_compensation_audit", ["job_id"])
    op.create_table(
        "t_bulk_job",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("action", sa.String(16), nullable=False, comment="retry, resolve or discard"),
        sa.Column("status", sa.SmallInteger, nullable=False, comment="1 running, 2 paused, 3 done, 4 aborted"),
        sa.Column("filter", sa.Text, nullable=False, comment="the queue filter that selected the rows, JSON"),
        sa.Column("note", sa.String(1024), nullable=True, comment="what the person wrote"),
        sa.Column("created_by", sa.String(128), nullable=False, comment="web:<who> or cli:<who>"),
        sa.Column("expected_count", sa.Integer, nullable=False, comment="the count the person saw in the dry run"),
        sa.Column("total", sa.Integer, nullable=False, comment="the rows the job took (its items)"),
        sa.Column("done_count", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("changed_count", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("failed_count", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("rate_per_minute", sa.Integer, nullable=True, comment="rows a minute, lately"),
        sa.Column("owner", sa.String(128), nullable=True, comment="the worker running it now"),
        sa.Column("lease_until", DATETIME(fsp=3), nullable=True, comment="its run is exclusive until then"),
        sa.Column("paused_by", sa.String(128), nullable=True),
        sa.Column("aborted_by", sa.String(128), nullable=True),
        sa.Column("finished_at", DATETIME(fsp=3), nullable=True),
        sa.Column("gmt_create", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("gmt_modified", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        **TABLE_ARGS,
    )
    op.create_index("idx_group_status", "t_bulk_job", ["consumer_group", "status", "id"])
    op.create_table(
        "t_bulk_item",
        sa.Column("job_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("compensation_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("state", sa.SmallInteger, nullable=False, server_default=sa.text("0"), comment="0 pending, 1 done"),
        sa.Column("outcome", sa.String(16), nullable=True, comment="changed, unchanged or failed"),
        sa.Column("detail", sa.String(1024), nullable=True, comment="why it failed, or what the action found"),
        sa.Column("not_before", DATETIME(fsp=3), nullable=True, comment="busy elsewhere: tried again from then"),
        sa.Column("gmt_modified", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        **TABLE_ARGS,
    )
    op.create_index("idx_job_state", "t_bulk_item", ["job_id", "state", "compensation_id"])


def downgrade() -> None:
    op.drop_table("t_bulk_item")
    op.drop_table("t_bulk_job")
    op.drop_index("idx_job", "t_compensation_audit")
    op.drop_column("t_compensation_audit", "job_id")
