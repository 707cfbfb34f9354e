"""The database's clock, for the dates every worker must agree on.

The retention's cutoff decides which events are refused, and the partition maintenance
which months are dropped; a worker whose clock runs a day behind another's could run an
event whose rows the other has just dropped. Both read "today" here: the database's clock,
read at start-up and with every refresh of the gauges (``METRICS_REFRESH_SECONDS``), and
carried forward on this process's clock in between.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, date, datetime

from app.adapters.mysql.store import MySqlStore

log = logging.getLogger(__name__)


class DatabaseClock:
    def __init__(self) -> None:
        self.offset = 0.0          # the database's clock minus this process's, in seconds
        self.synced = False

    async def sync(self, store: MySqlStore) -> float:
        """Read the database's clock; return how far this process's is off."""
        async def read(tx) -> float:
            return float((await tx._exec("SELECT UNIX_TIMESTAMP(NOW(6))")).scalar())
        before = time.time()
        theirs = await store.in_transaction(read)
        after = time.time()
        offset = theirs - (before + after) / 2
        if abs(offset) > 60 and (not self.synced or abs(offset - self.offset) > 60):
            log.warning("this worker's clock is %.0f s %s the database's: dates (the retention, the partitions) "
                        "follow the database's", abs(offset), "behind" if offset > 0 else "ahead of")
        self.offset, self.synced = offset, True
        return offset

    def now(self) -> datetime:
        return datetime.fromtimestamp(time.time() + self.offset, UTC)

    def today(self) -> date:
        return self.now().date()
