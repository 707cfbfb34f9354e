"""Error groups: what each group is (``t_error_group``) and its letters per hour of first
failure (``t_error_group_hour``), an index that reads the unsettled part of every group, and
the fingerprint of every ledger row written before (computed here, in batches, with the same
pure function the ledger uses), so that no row is left without a group.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

from app.compensation.fingerprints import shape

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

NOW3 = sa.text("CURRENT_TIMESTAMP(3)")
TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
BATCH = 5000


def upgrade() -> None:
    op.create_table(
        "t_error_group",
        sa.Column("consumer_group", sa.String(255), primary_key=True),
        sa.Column("fingerprint", sa.String(16), primary_key=True),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("effect", sa.String(32), nullable=False, comment="the effect the message names, - if none"),
        sa.Column("detail", sa.String(64), nullable=False,
                  comment="the service's status or the error class, - if neither"),
        sa.Column("sample", sa.String(1024), nullable=True,
                  comment="the message of the latest letter that joined the group"),
        sa.Column("gmt_create", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        sa.Column("gmt_modified", DATETIME(fsp=3), nullable=False, server_default=NOW3),
        **TABLE_ARGS,
    )
    op.create_table(
        "t_error_group_hour",
        sa.Column("consumer_group", sa.String(255), primary_key=True),
        sa.Column("fingerprint", sa.String(16), primary_key=True),
        sa.Column("hour", DATETIME(fsp=0), primary_key=True, comment="the UTC hour of the letters' first failure"),
        sa.Column("letters", sa.Integer, nullable=False,
                  comment="ledger rows of the group whose first failure is in the hour"),
        sa.Column("first_at", DATETIME(fsp=3), nullable=False,
                  comment="the earliest first failure that joined the bucket"),
        sa.Column("last_at", DATETIME(fsp=3), nullable=False,
                  comment="the latest first failure that joined the bucket"),
        **TABLE_ARGS,
    )
    op.create_index("idx_group_hour", "t_error_group_hour", ["consumer_group", "hour"])
    op.create_index("idx_group_status_fingerprint", "t_compensation",
                    ["consumer_group", "status", "fingerprint", "order_no", "first_failure_at"])
    _backfill(op.get_bind())


def _backfill(bind) -> None:
    """Every row's fingerprint, then the summary from the rows (the workers of this revision
    keep it from here on)."""
    last = 0
    groups: dict[tuple[str, str], tuple] = {}
    while True:
        rows = bind.execute(sa.text(
            "SELECT id, consumer_group, reason, message FROM t_compensation WHERE id > :last AND fingerprint IS NULL "
            f"ORDER BY id LIMIT {BATCH}"), {"last": last}).all()
        if not rows:
            break
        ids: dict[str, list[int]] = {}
        for row_id, group, reason, message in rows:
            cause = shape(reason, message)
            ids.setdefault(cause.fingerprint, []).append(row_id)
            groups[(group, cause.fingerprint)] = (cause, message)     # the latest id's message stays
        for fingerprint, some in ids.items():       # one statement per group in the batch
            bind.execute(sa.text("UPDATE t_compensation SET fingerprint = :f WHERE id IN :ids").bindparams(
                sa.bindparam("ids", expanding=True)), {"f": fingerprint, "ids": some})
        last = rows[-1][0]
    for (group, fingerprint), (cause, message) in sorted(groups.items()):
        bind.execute(sa.text(
            "INSERT INTO t_error_group (consumer_group, fingerprint, reason, effect, detail, sample, gmt_create, "
            "gmt_modified) VALUES (:g, :f, :r, :e, :d, :s, NOW(3), NOW(3))"),
            {"g": group, "f": fingerprint, "r": cause.reason[:64], "e": cause.effect[:32], "d": cause.detail[:64],
             "s": (message or "")[:1024]})
    bind.execute(sa.text(
        "INSERT INTO t_error_group_hour (consumer_group, fingerprint, hour, letters, first_at, last_at) "
        "SELECT consumer_group, fingerprint, DATE_FORMAT(first_failure_at, '%Y-%m-%d %H:00:00'), COUNT(*), "
        "MIN(first_failure_at), MAX(first_failure_at) FROM t_compensation WHERE fingerprint IS NOT NULL "
        "GROUP BY consumer_group, fingerprint, DATE_FORMAT(first_failure_at, '%Y-%m-%d %H:00:00')"))


def downgrade() -> None:
    op.drop_index("idx_group_status_fingerprint", "t_compensation")
    op.drop_table("t_error_group_hour")
    op.drop_table("t_error_group")
