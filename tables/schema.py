"""The tables. Statuses are small integers; their meaning lives in ``app.pipeline.states``."""

from sqlalchemy import Column, Index, Integer, MetaData, SmallInteger, String, Table, text
from sqlalchemy.dialects.mysql import DATETIME

metadata = MetaData()

NOW3 = text("CURRENT_TIMESTAMP(3)")

# One row per idempotency key: the memory of "have I done this, and how far".
t_idem = Table(
    "t_idem",
    metadata,
    Column("biz_key", String(128), primary_key=True),
    Column("status", SmallInteger, nullable=False, comment="1 pending, 2 done, 3 failed"),
    Column("attempt", Integer, nullable=False, server_default=text("0")),
    Column("last_err", String(512), nullable=True),
    Column("idem_token", String(64), nullable=True),
    Column("owner", String(128), nullable=True),
    Column("gmt_create", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("gmt_modified", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Index("idx_status_modified", "status", "gmt_modified"),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)
