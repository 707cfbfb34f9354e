"""The idempotent-step pipeline: t_idem keyed by (biz_key, part_date) with lease,
payload hash, step and outcome; t_order; t_waybill_receipt.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

NOW3 = sa.text("CURRENT_TIMESTAMP(3)")
TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def timestamps():
    return [sa.Column("gmt_create", DATETIME(fsp=3), nullable=False, server_default=NOW3),
            sa.Column("gmt_modified", DATETIME(fsp=3), nullable=False, server_default=NOW3)]


def upgrade() -> None:
    # Keys are compared byte for byte.
    op.execute("ALTER TABLE t_idem CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    op.add_column("t_idem", sa.Column("part_date", sa.Date, nullable=True))
    op.add_column("t_idem", sa.Column("step", sa.String(32), nullable=True))
    op.add_column("t_idem", sa.Column("lease_until", DATETIME(fsp=3), nullable=True,
                                      comment="claim is exclusive until then"))
    op.add_column("t_idem", sa.Column("payload_hash", sa.String(64), nullable=True,
                                      comment="sha256 of order_no, type and data"))
    op.add_column("t_idem", sa.Column("outcome", sa.String(64), nullable=True,
                                      comment="applied/stale/waybill_issued/... or the failure reason"))
    # Rows of the walking skeleton: their key starts with the order number (ORD-YYYYMMDD-...);
    # a key without a real date there gets 1970-01-01. The date is checked before STR_TO_DATE
    # sees it: in strict mode (MariaDB's default and MySQL 8's) STR_TO_DATE stops the UPDATE at
    # the first key that is no date instead of giving NULL, and without NO_ZERO_DATE and
    # NO_ZERO_IN_DATE it gives zero dates (2026-11-00). CASE tries its conditions in order, so
    # LAST_DAY only ever sees a real month.
    ymd = "SUBSTRING(biz_key, 5, 8)"
    op.execute("UPDATE t_idem SET part_date = CASE "
               f"WHEN NOT ({ymd} REGEXP '^[0-9]{{8}}$' AND SUBSTRING(biz_key, 5, 4) >= '1000' "
               "AND SUBSTRING(biz_key, 9, 2) BETWEEN '01' AND '12') THEN '1970-01-01' "
               "WHEN SUBSTRING(biz_key, 11, 2) BETWEEN '01' "
               "AND DATE_FORMAT(LAST_DAY(CONCAT(SUBSTRING(biz_key, 5, 6), '01')), '%d') "
               f"THEN STR_TO_DATE({ymd}, '%Y%m%d') ELSE '1970-01-01' END, "
               "step = 'skeleton', payload_hash = ''")
    op.alter_column("t_idem", "part_date", existing_type=sa.Date, nullable=False)
    op.alter_column("t_idem", "step", existing_type=sa.String(32), nullable=False)
    op.alter_column("t_idem", "payload_hash", existing_type=sa.String(64), nullable=False,
                    existing_comment="sha256 of order_no, type and data")
    op.alter_column("t_idem", "attempt", existing_type=sa.Integer, existing_nullable=False,
                    existing_server_default=sa.text("0"), comment="claims so far; the fencing token")
    op.alter_column("t_idem", "owner", existing_type=sa.String(128), existing_nullable=True,
                    comment="worker incarnation holding the claim")
    op.alter_column("t_idem", "idem_token", existing_type=sa.String(64), existing_nullable=True,
                    comment="sent as Idempotency-Key on every call")
    op.execute("ALTER TABLE t_idem DROP PRIMARY KEY, ADD PRIMARY KEY (biz_key, part_date)")

    op.create_table(
        "t_order",
        sa.Column("order_no", sa.String(64), primary_key=True),
        sa.Column("status", sa.SmallInteger, nullable=False, comment="1 created, 2 paid, 3 confirmed, 4 cancelled"),
        sa.Column("amount_cents", sa.BigInteger, nullable=True),
        sa.Column("phone", sa.String(32), nullable=True),
        sa.Column("address", sa.String(512), nullable=True),
        sa.Column("paid_cents", sa.BigInteger, nullable=True),
        sa.Column("cancel_reason", sa.String(255), nullable=True),
        *timestamps(),
        **TABLE_ARGS,
    )
    op.create_table(
        "t_waybill_receipt",
        sa.Column("order_no", sa.String(64), primary_key=True),
        sa.Column("waybill_no", sa.String(64), nullable=False),
        sa.Column("idem_token", sa.String(64), nullable=False),
        sa.Column("biz_key", sa.String(128), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("gmt_create", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        **TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("t_waybill_receipt")
    op.drop_table("t_order")
    op.execute("ALTER TABLE t_idem DROP PRIMARY KEY, ADD PRIMARY KEY (biz_key)")
    for column in ("outcome", "payload_hash", "lease_until", "step", "part_date"):
        op.drop_column("t_idem", column)
    op.alter_column("t_idem", "attempt", existing_type=sa.Integer, existing_nullable=False,
                    existing_server_default=sa.text("0"), comment=None)
    op.alter_column("t_idem", "owner", existing_type=sa.String(128), existing_nullable=True, comment=None)
    op.alter_column("t_idem", "idem_token", existing_type=sa.String(64), existing_nullable=True, comment=None)
    # Back to the character set's default collation, as 0001 created the table: utf8mb4_general_ci
    # on MariaDB 10.11, utf8mb4_0900_ai_ci on MySQL 8 (naming one restored MariaDB's alone).
    op.execute("ALTER TABLE t_idem CONVERT TO CHARACTER SET utf8mb4")
