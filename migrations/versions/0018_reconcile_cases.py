"""Cases for a person from the providers' reconciliation (``t_reconcile_case``, its history in
``t_reconcile_case_audit``): a duplicate at the provider, an orphan waybill, a missing one; and our
waybill receipts read by time range (``idx_gmt_create``).

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

NOW3 = sa.text("CURRENT_TIMESTAMP(3)")
TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "t_reconcile_case",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False, comment="duplicate, orphan, missing"),
        sa.Column("effect", sa.String(32), nullable=False),
        sa.Column("provider", sa.String(32), nullable=False),
        sa.Column("order_no", sa.String(64), nullable=False),
        sa.Column("reference", sa.String(64), nullable=False,
                  comment="the extra waybill (duplicate), the one we hold no receipt for (orphan), our receipt's "
                          "(missing)"),
        sa.Column("evidence", sa.Text, nullable=False, comment="what the run saw, JSON"),
        sa.Column("status", sa.SmallInteger, nullable=False, comment="1 open, 2 adopted, 3 compensated, 4 dismissed"),
        sa.Column("found_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("last_seen_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("found_by_run", sa.BigInteger, nullable=True,
                  comment="the reconcile run (t_reconcile_run) that found it"),
        sa.Column("closed_at", DATETIME(fsp=3), nullable=True),
        sa.Column("closed_by", sa.String(128), nullable=True, comment="web:<who>, cli:<who>"),
        sa.Column("note", sa.String(1024), nullable=True, comment="what the person who closed it wrote"),
        sa.UniqueConstraint("consumer_group", "kind", "effect", "reference", name="uk_case"),
        sa.Index("idx_group_status_id", "consumer_group", "status", "id"),
        **TABLE_ARGS,
    )
    op.create_table(
        "t_reconcile_case_audit",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("case_id", sa.BigInteger, nullable=False),
        sa.Column("at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("actor", sa.String(128), nullable=False, comment="reconcile:<run>, web:<who>, cli:<who>"),
        sa.Column("action", sa.String(32), nullable=False, comment="opened, compensate, adopt, dismiss"),
        sa.Column("from_status", sa.SmallInteger, nullable=True),
        sa.Column("to_status", sa.SmallInteger, nullable=True),
        sa.Column("note", sa.String(1024), nullable=True, comment="what the person wrote"),
        sa.Column("detail", sa.String(1024), nullable=True, comment="what happened: the provider's answer, or why not"),
        sa.Index("idx_case", "case_id", "id"),
        **TABLE_ARGS,
    )
    op.create_index("idx_gmt_create", "t_waybill_receipt", ["gmt_create"])


def downgrade() -> None:
    op.drop_index("idx_gmt_create", "t_waybill_receipt")
    op.drop_table("t_reconcile_case_audit")
    op.drop_table("t_reconcile_case")
