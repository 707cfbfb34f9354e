"""Dates every worker must agree on come from the database's clock, not the worker's."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from app.adapters.mysql.clock import DatabaseClock
from app.pipeline.retention import Retention


class Scalar:
    def __init__(self, value: float) -> None:
        self.value = value

    def scalar(self) -> float:
        return self.value


class StoreAhead:
    """A database whose clock is ``ahead`` seconds ahead of this process's."""

    def __init__(self, ahead: float) -> None:
        self.ahead = ahead

    async def in_transaction(self, work):
        store = self

        class Tx:
            async def _exec(self, sql, params=()):
                assert "UNIX_TIMESTAMP(NOW(6))" in sql
                return Scalar(time.time() + store.ahead)
        return await work(Tx())


async def test_the_retention_cutoff_follows_the_databases_clock_not_the_workers():
    clock = DatabaseClock()
    offset = await clock.sync(StoreAhead(3 * 86400))
    assert abs(offset - 3 * 86400) < 5
    theirs = (datetime.now(UTC) + timedelta(days=3)).date()
    assert clock.today() == theirs
    retention = Retention(90, today=clock.today, ahead=3)
    assert retention.cutoff() == theirs - timedelta(days=90)        # a worker 3 days behind refuses as the others do
