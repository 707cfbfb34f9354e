"""When each step's first call that may have reached its provider began (``t_idem.first_call_at``):
a provider keeps an idempotency key for a while only (``keys_kept_for``), and a step whose first
call is older than that is asked about, or left to a person, never repeated blindly.

Expands the schema only: one nullable column at the end of ``t_idem``, no default, no index, no
row rewritten. ``ALGORITHM=INSTANT``: a change of the table's definition alone on MariaDB 10.3+ and
MySQL 8.0 (partitioned tables included), whatever the table holds. It takes the table's metadata
lock for that moment only, but must first wait for every transaction open on ``t_idem`` to end, and
statements that come meanwhile wait behind it: run it when no long transaction is open (a long
reconcile read, a console export; the workers' own transactions last milliseconds). A server that
cannot add the column instantly refuses the statement (nothing is changed, nothing is locked)
rather than rebuilding the table; there, run it with ``ALGORITHM=INPLACE, LOCK=NONE`` in a quiet hour.

Release N-1 runs on this schema: its inserts leave the column NULL, which this release reads as
the row's creation (earlier than any call of it, so a key's age errs long: a lookup or a person,
never a blind repeat).

Revision ID: 0019
Revises: 0018
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

OLDEST_RELEASE_SERVED = None    # expands only: every release the schema served before, it serves still


def upgrade() -> None:
    op.execute("ALTER TABLE t_idem ADD COLUMN first_call_at DATETIME(3) NULL COMMENT "
               "'when the first claim whose call may have reached the provider began; NULL: none did yet', "
               "ALGORITHM=INSTANT")


def downgrade() -> None:
    op.execute("ALTER TABLE t_idem DROP COLUMN first_call_at")
