"""What the ledger keeps of a record is bounded: the size and SHA-256 of a key or value it
cut (an event it could decode is kept whole; anything else to its first 64 KiB).

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

COLUMNS = (
    ("record_key_bytes", sa.BigInteger, "the size of the record's key, when record_key holds only its start"),
    ("record_key_sha256", sa.String(64), "the SHA-256 of the whole key, when record_key holds only its start"),
    ("record_value_bytes", sa.BigInteger, "the size of the record's value, when record_value holds only its start"),
    ("record_value_sha256", sa.String(64), "the SHA-256 of the whole value, when record_value holds only its start"),
)


def upgrade() -> None:
    for name, kind, comment in COLUMNS:
        op.add_column("t_compensation", sa.Column(name, kind, nullable=True, comment=comment))


def downgrade() -> None:
    for name, _, _ in reversed(COLUMNS):
        op.drop_column("t_compensation", name)
