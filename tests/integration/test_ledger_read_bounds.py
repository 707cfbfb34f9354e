"""Reads that run on their own stay bounded however big the queue grows, on real MariaDB: the
dead-letter gauges every worker reads every few seconds, and an order's dead letters in its
timeline. The cap is lowered to 500 over 5,000 waiting rows (the benchmark
``python -m bench.ledger_reads`` measures the default cap over a million); what MariaDB read is
counted by ``ANALYZE``, not timed."""

from __future__ import annotations

import pytest

from app.adapters.mysql import MySqlStore
from app.adapters.mysql.engine import create_engine
from app.adapters.mysql.reads import backlog as watch_module
from app.adapters.mysql.reads import console as queries_module
from app.adapters.mysql.reads.backlog import Watch
from app.adapters.mysql.reads.console import Queries
from bench.growth.plans import explain
from bench.growth.recording import statements_of
from bench.ledger_reads import flood_statement, unsettled_statement
from harness.services import ScratchDatabase

CAP, FLOOD, ONE_ORDER = 500, 5_000, 1_200
GROUP, ORDER = "g-read-bounds", "ORD-20261201-LOOPTEST"


@pytest.fixture(scope="module")
def flooded(settings):
    """A database of its own: ``FLOOD`` manual rows (``ONE_ORDER`` of one order), 300 open, 20 retrying."""
    db = ScratchDatabase(settings.database.url, sql_mode=settings.database.sql_mode).create()
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
        cur.execute(flood_statement(1, FLOOD, ONE_ORDER, group=GROUP, order=ORDER))
        cur.execute(unsettled_statement(FLOOD + 1, group=GROUP))
        cur.execute("ANALYZE TABLE t_compensation")
    yield db
    db.drop()


@pytest.fixture
async def store(settings, flooded, monkeypatch):
    monkeypatch.setattr(watch_module, "COUNT_CAP", CAP)
    monkeypatch.setattr(queries_module, "COUNT_CAP", CAP)
    engine = create_engine(settings, url=flooded.url)
    yield MySqlStore(engine)
    await engine.dispose()


def ledger_rows_read(db: ScratchDatabase, statements: list[tuple[str, list]]) -> int:
    read = 0
    for sql, params in statements:
        for step in explain(db.url, "read", sql, params).analyze:
            if step.get("table") == "t_compensation":
                read += int(float(step.get("r_rows") or 0))
    return read


async def test_the_dead_letter_gauges_read_at_most_the_cap_of_each_status_and_one_row_for_its_age(flooded, store):
    gauges = await Watch(store).gauges(group=GROUP, stuck_after_seconds=600, attempt_cap=20)
    assert gauges.compensation_by_status == {"open": 300, "retrying": 20, "manual": CAP}
    oldest = flooded.scalar("SELECT TIMESTAMPDIFF(SECOND, MIN(first_failure_at), UTC_TIMESTAMP(3)) FROM t_compensation "
                            "WHERE consumer_group = %s AND status = 4", GROUP)
    assert abs(gauges.oldest_manual_seconds - oldest) < 60

    statements = await statements_of(lambda s: Watch(s).gauges(group=GROUP, stuck_after_seconds=600, attempt_cap=20))
    assert ledger_rows_read(flooded, statements) <= CAP + 300 + 20 + 3      # the counts, then one row per age


async def test_an_orders_timeline_shows_its_newest_dead_letters_and_a_count_that_stops_at_the_cap(flooded, store):
    queries = Queries(store, group=GROUP)
    letters = await queries.dead_letters_of_order(ORDER)
    newest = [row["id"] for row in flooded.query("SELECT id FROM t_compensation WHERE order_no = %s "
                                                 "ORDER BY id DESC LIMIT 50", ORDER)]
    assert [row["id"] for row in letters] == newest[::-1]                # the newest 50, oldest of them first
    assert await queries.dead_letters_of_order_count(ORDER) == CAP + 1     # "more than the cap"
    assert await queries.dead_letters_of_order_count("ORD-20261201-NONE") == 0

    statements = await statements_of(lambda s: Queries(s, group=GROUP).dead_letters_of_order(ORDER))
    statements += await statements_of(lambda s: Queries(s, group=GROUP).dead_letters_of_order_count(ORDER))
    assert ledger_rows_read(flooded, statements) <= 50 + CAP + 1
