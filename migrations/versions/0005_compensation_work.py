"""The compensator's working state: the dead-lettered record itself in the ledger (so a
row can be redriven without the topic), the row's claim (owner, lease), the audit trail,
and named leases for timers.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME, MEDIUMBLOB

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

NOW3 = sa.text("CURRENT_TIMESTAMP(3)")
TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.alter_column("t_compensation", "status", existing_type=sa.SmallInteger, existing_nullable=False,
                    comment="1 open, 2 retrying, 3 compensated, 4 manual, 5 discarded, 6 superseded, 7 resolved",
                    existing_comment="1 open, 2 retrying, 3 compensated, 4 manual, 5 discarded")
    op.add_column("t_compensation", sa.Column("record_key", MEDIUMBLOB, nullable=True,
                                              comment="the record's key as dead-lettered"))
    op.add_column("t_compensation", sa.Column("record_value", MEDIUMBLOB, nullable=True,
                                              comment="the record's value as dead-lettered"))
    op.add_column("t_compensation", sa.Column("record_headers", sa.Text, nullable=True,
                                              comment="its own headers, JSON [[key, base64 value or null]]"))
    op.add_column("t_compensation", sa.Column("redrives", sa.Integer, nullable=False, server_default=sa.text("0"),
                                              comment="times the compensator ran the event again"))
    op.add_column("t_compensation", sa.Column("owner", sa.String(128), nullable=True,
                                              comment="who is working the row now (status 2)"))
    op.add_column("t_compensation", sa.Column("lease_until", DATETIME(fsp=3), nullable=True,
                                              comment="the claim of status 2 is exclusive until then"))
    op.create_index("idx_status_id", "t_compensation", ["status", "id"])
    op.create_index("idx_reason_id", "t_compensation", ["reason", "id"])
    op.create_table(
        "t_compensation_audit",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("compensation_id", sa.BigInteger, nullable=False),
        sa.Column("at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("actor", sa.String(128), nullable=False, comment="compensator, timer, web:<who>, cli:<who>"),
        sa.Column("action", sa.String(32), nullable=False, comment="attempt, retry, resolve, discard, opened"),
        sa.Column("from_status", sa.SmallInteger, nullable=True),
        sa.Column("to_status", sa.SmallInteger, nullable=True),
        sa.Column("note", sa.String(1024), nullable=True, comment="what the person wrote"),
        sa.Column("detail", sa.String(1024), nullable=True, comment="what happened: an outcome or an error"),
        **TABLE_ARGS,
    )
    op.create_index("idx_compensation", "t_compensation_audit", ["compensation_id", "id"])
    op.create_table(
        "t_lease",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("lease_until", DATETIME(fsp=3), nullable=False),
        sa.Column("gmt_modified", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        **TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("t_lease")
    op.drop_table("t_compensation_audit")
    op.drop_index("idx_reason_id", "t_compensation")
    op.drop_index("idx_status_id", "t_compensation")
    for column in ("lease_until", "owner", "redrives", "record_headers", "record_value", "record_key"):
        op.drop_column("t_compensation", column)
    op.alter_column("t_compensation", "status", existing_type=sa.SmallInteger, existing_nullable=False,
                    comment="1 open, 2 retrying, 3 compensated, 4 manual, 5 discarded",
                    existing_comment="1 open, 2 retrying, 3 compensated, 4 manual, 5 discarded, 6 superseded, 7 resolved")
