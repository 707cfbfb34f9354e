"""The processor's scenario table (``harness/scenarios.py``) on MariaDB: the same
scenarios the in-memory store passes in ``tests/unit/test_processor_scenarios.py``, so
the fake's rules are checked against the real ones."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.adapters.mysql import MySqlStore
from app.adapters.mysql.engine import create_engine
from app.pipeline.liveness_fence import incarnation_of
from harness import sql_modes
from harness.scenarios import SCENARIOS, Harness, MemoryEffects

# Every database test here runs under the server's sql_mode and under MySQL 8's.
settings, scratch_db = sql_modes.each_sql_mode()


class MySqlHarness(Harness):
    def __init__(self, settings, db) -> None:
        self.db = db
        self.engine = create_engine(settings, url=db.url)
        self.store = MySqlStore(self.engine)
        self.effects = MemoryEffects(self.wait)

    def clock(self):
        return time.monotonic

    async def pass_time(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def _one(self, sql: str, *args) -> dict | None:
        rows = self.db.query(sql, *args)
        return rows[0] if rows else None

    def idem(self, key: str) -> dict | None:
        return self._one("SELECT * FROM t_idem WHERE biz_key = %s", key)

    def order(self, order: str) -> dict | None:
        return self._one("SELECT * FROM t_order WHERE order_no = %s", order)

    def receipt(self, order: str) -> dict | None:
        return self._one("SELECT * FROM t_waybill_receipt WHERE order_no = %s", order)

    def ledger(self, topic: str) -> list[dict]:
        return self.db.query("SELECT * FROM t_compensation WHERE src_topic = %s", topic)

    TABLES = (("t_idem", "biz_key LIKE %s", "{order}:%"), ("t_order", "order_no = %s", "{order}"),
              ("t_waybill_receipt", "order_no = %s", "{order}"))

    def backup(self, order: str):
        return order, {table: self.db.query(f"SELECT * FROM {table} WHERE {where}", arg.format(order=order))
                       for table, where, arg in self.TABLES}

    def restore(self, backup) -> None:
        order, tables = backup
        for table, where, arg in self.TABLES:
            self.db.query(f"DELETE FROM {table} WHERE {where}", arg.format(order=order))
            for row in tables[table]:
                columns = ", ".join(row)
                self.db.query(f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(row))})",
                              *row.values())

    def open_recovery_window(self, age: float = 0.0) -> None:
        self.db.query("INSERT INTO t_recovery_window (opened_at, ends_at, opened_by, reason) VALUES "
                      f"(NOW(3) - INTERVAL {int(age * 1e6)} MICROSECOND, NOW(3) + INTERVAL 1 HOUR, 'cli:test', "
                      "'a scenario')")

    def beat(self, p) -> None:
        sent = time.monotonic()
        self.db.query("INSERT INTO t_worker (incarnation, worker_id, started_at, last_seen) VALUES (%s, 'scenario', "
                      "NOW(3), NOW(3)) ON DUPLICATE KEY UPDATE last_seen = NOW(3)", incarnation_of(p.owner))
        p.fence.beat(sent, time.monotonic())

    def end_recovery_window(self) -> None:
        self.db.query("UPDATE t_recovery_window SET ended_at = NOW(3), ended_by = 'cli:test' WHERE ended_at IS NULL")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_scenario_on_mariadb(scenario, settings, scratch_db):
    harness = MySqlHarness(settings, scratch_db)
    try:
        await scenario(harness)
    finally:
        await harness.engine.dispose()
        scratch_db.query("DELETE FROM t_recovery_window")    # an open window changes every later test
