"""How a migration waits for a table's metadata lock without stalling the workers queued behind it.

Every ``ALTER TABLE``, ``ALGORITHM=INSTANT`` included, takes its table's metadata lock exclusively
for a moment (an ``INPLACE`` one at its start and again at its end), and before that it waits for
every transaction open on the table to end. Statements that come meanwhile wait behind it::

    t0  a long transaction reads t_idem (a console export, a person's session)  holds it shared
    t1  ALTER TABLE t_idem ... ALGORITHM=INSTANT                                waits for t0
    t2  every worker's T1 and T3 on t_idem                                      wait behind t1
    ... until t0 ends, or until lock_wait_timeout runs out: a day on MariaDB, a year on MySQL 8

So the migration's session sets ``lock_wait_timeout`` to ``MIGRATION_LOCK_WAIT_SECONDS``: a wait
that runs out fails with 1205, the statements behind it go on, and after a pause twice as long the
run is tried again, ``MIGRATION_LOCK_TRIES`` times in all. A try that gave up changed nothing: a
statement that did not get its lock did nothing (DDL is atomic on MariaDB 10.6+ and MySQL 8),
Alembic recorded every migration before it, and a migration that alters a table the workers write
is that one statement (the rule ``tests/integration/test_online_migrations.py`` holds), so the next
try starts at that migration. An ``INPLACE`` statement that ran its whole build and then waited in
vain at its end threw that build away: it is built again at the next try.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)

LOCK_WAIT_TIMEOUT = 1205        # ER_LOCK_WAIT_TIMEOUT: also what a metadata lock wait that ran out raises
ACCESS_DENIED = 1227            # ER_SPECIFIC_ACCESS_DENIED_ERROR: INNODB_TRX needs the PROCESS privilege


class LockNotGranted(RuntimeError):
    """A migration waited for a table's metadata lock in vain, every try."""


def error_code(exc: DBAPIError) -> int | None:
    args = getattr(exc.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


@dataclass(frozen=True)
class LockWaits:
    wait_seconds: int           # lock_wait_timeout of the session; 0: the server's
    tries: int

    @classmethod
    def from_settings(cls, database) -> LockWaits:
        return cls(database.migration_lock_wait_seconds, database.migration_lock_tries)

    def session_assignment(self) -> str | None:
        """What the migration's ``SET SESSION`` adds, or None to keep the server's timeout."""
        return f"lock_wait_timeout = {int(self.wait_seconds)}" if self.wait_seconds else None

    @property
    def pause_seconds(self) -> float:
        # The workers were held up for at most wait_seconds: give them twice that to catch up,
        # and the long transaction as long to end, before the table is asked for again.
        return 2.0 * self.wait_seconds

    def run(self, once: Callable[[], None], *, holders: Callable[[], str] = lambda: "",
            sleep: Callable[[float], None] = time.sleep) -> None:
        """Call ``once`` (the whole migration run) until it does not fail for a lock wait; raise
        :class:`LockNotGranted` after ``tries`` such failures, naming what held the table."""
        for attempt in range(1, self.tries + 1):
            try:
                once()
                return
            except DBAPIError as exc:
                if error_code(exc) != LOCK_WAIT_TIMEOUT:
                    raise
                held = holders()
                if attempt == self.tries:
                    raise LockNotGranted(
                        f"a table's metadata lock did not come in {self.tries} tries of {self.wait_seconds}s "
                        f"(MIGRATION_LOCK_WAIT_SECONDS, MIGRATION_LOCK_TRIES); nothing of the migration that "
                        f"waited was changed, run it again once they end. {held}".rstrip()) from None
                log.warning("a table's metadata lock did not come within %ss (try %d of %d): the workers' "
                            "statements behind it went on; trying again in %.0fs. %s", self.wait_seconds, attempt,
                            self.tries, self.pause_seconds, held)
                sleep(self.pause_seconds)


def open_transactions(connection: Connection, older_than: float) -> str:
    """The transactions open for ``older_than`` seconds or longer (which hold their tables'
    metadata locks), as one sentence for the operator; what is missing, when it cannot be read."""
    try:
        rows = connection.exec_driver_sql(
            "SELECT p.ID, p.USER, p.HOST, p.DB, TIMESTAMPDIFF(SECOND, trx.TRX_STARTED, NOW()), "
            "LEFT(COALESCE(p.INFO, ''), 80) FROM information_schema.INNODB_TRX AS trx "
            "JOIN information_schema.PROCESSLIST AS p ON p.ID = trx.TRX_MYSQL_THREAD_ID "
            "WHERE trx.TRX_STARTED <= NOW() - INTERVAL %s SECOND AND p.ID <> CONNECTION_ID() "
            "ORDER BY trx.TRX_STARTED LIMIT 5", (int(older_than),)).all()
    except DBAPIError as exc:
        if error_code(exc) == ACCESS_DENIED:
            return ("The open transactions could not be listed: this user lacks the PROCESS privilege "
                    "(an administrator sees them in information_schema.INNODB_TRX).")
        raise
    if not rows:
        return "No transaction older than that is open now."
    described = "; ".join(f"connection {i} ({user}@{host}, database {db}, open {age}s"
                          + (f", running {info!r})" if info else ", idle)")
                          for i, user, host, db, age, info in rows)
    return f"Transactions open longest: {described}."
