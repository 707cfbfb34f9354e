"""t_idem's monthly partitions against real MariaDB: migration 0006 converts a table that
holds rows, the maintenance adds months ahead and drops the ones past the retention, and
a drop that cannot get its metadata lock gives up after ``hold_seconds`` instead of
parking the pipeline behind it."""

from __future__ import annotations

import asyncio
import statistics
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import pytest

from app.adapters.mysql import MySqlStore
from app.adapters.mysql.engine import create_engine
from app.adapters.mysql.partitions import CATCH_ALL, Partitions, month_name, month_start
from app.pipeline.processor import Processor
from app.pipeline.retention import Retention
from app.timers.partitions import MaintenanceReport, maintain
from harness import sql_modes
from harness.events import order_no
from harness.fakes import fakes_in_process
from harness.pipeline import Harness, ev
from harness.services import ScratchDatabase, connect

# Every database test here runs under the server's sql_mode and under MySQL 8's.
settings, scratch_db = sql_modes.each_sql_mode()

RETENTION_DAYS = 90
AHEAD = 3
# The pipeline's slowest batch may exceed hold_seconds by this much (its own work, scheduling).
LATENCY_SLACK = 0.5
HOLD_LIMIT = 30.0           # the longest the "long transaction" stays open, whatever happens


def utc_today() -> date:
    return datetime.now(UTC).date()


# ------------------------------------------------------------------ helpers --

@pytest.fixture
def fresh_db(settings):
    """Databases of this test's own: the tests here drop partitions, which the session's
    scratch database (shared with every other test) must keep."""
    made: list[ScratchDatabase] = []

    def make(*, migrated: bool = True) -> ScratchDatabase:
        db = ScratchDatabase(settings.database.url, sql_mode=settings.database.sql_mode).create(migrated=migrated)
        made.append(db)
        return db

    yield make
    for db in made:
        db.drop()


@asynccontextmanager
async def pipeline_on(settings, db: ScratchDatabase):
    """A :class:`Harness` (real store, real processor, fake services over HTTP) on ``db``."""
    async with fakes_in_process() as (fakes, url):
        harness = Harness(settings, db, url)
        harness.fakes = fakes
        try:
            yield harness
        finally:
            await harness.close()


@asynccontextmanager
async def partitions_on(settings, db: ScratchDatabase, **options):
    engine = create_engine(settings, url=db.url)
    try:
        yield Partitions(MySqlStore(engine), **options)
    finally:
        await engine.dispose()


def insert_idem(db: ScratchDatabase, day: date, prefix: str = "PART") -> str:
    """A done t_idem row of an order dated ``day``, written directly (no event could be that old)."""
    key = f"{order_no(day=f'{day:%Y%m%d}', prefix=prefix)}:ORDER_CREATED:apply"
    db.query("INSERT INTO t_idem (biz_key, part_date, step, status, attempt, payload_hash, outcome) "
             "VALUES (%s, %s, 'apply', 2, 1, %s, 'applied')", key, day, "0" * 64)
    return key


def partition_bounds(db: ScratchDatabase) -> list[tuple[str, date | None]]:
    """``(name, VALUES LESS THAN)`` in order; ``None`` for MAXVALUE."""
    rows = db.query("SELECT PARTITION_NAME, PARTITION_DESCRIPTION FROM information_schema.PARTITIONS "
                    "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 't_idem' ORDER BY PARTITION_ORDINAL_POSITION")
    return [(r["PARTITION_NAME"], None if r["PARTITION_DESCRIPTION"] in (None, "MAXVALUE")
             else date.fromisoformat(r["PARTITION_DESCRIPTION"].strip("'"))) for r in rows]


def keys_in(db: ScratchDatabase, partition: str) -> set[str]:
    return {r["biz_key"] for r in db.query(f"SELECT biz_key FROM t_idem PARTITION ({partition})")}


def all_keys(db: ScratchDatabase) -> set[str]:
    return {r["biz_key"] for r in db.query("SELECT biz_key FROM t_idem")}


def snapshot(db: ScratchDatabase) -> list[dict]:
    return db.query("SELECT * FROM t_idem ORDER BY biz_key")


def migration_partition(day: date, migration_day: date) -> str:
    """Where migration 0006, run on ``migration_day``, puts a row dated ``day``."""
    this_month = month_start(migration_day)
    if day < month_start(this_month, -12):
        return "p_before"
    if day >= month_start(this_month, 4):
        return CATCH_ALL
    return month_name(month_start(day))


def droppable(bounds, drop_before: date) -> list[str]:
    return [name for name, below in bounds if below is not None and below <= drop_before]


# --------------------------------------------------- the pipeline in a loop --

@dataclass
class PipelineLoop:
    """Batches of ORDER_CREATED + ORDER_PAID of a fresh order, one after another, each timed."""

    processor: Processor
    prefix: str
    latencies: list[float] = field(default_factory=list)
    orders: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def batch(self) -> float:
        order = order_no(prefix=self.prefix)
        started = time.monotonic()
        try:
            results = await self.processor.run([ev(order, "ORDER_CREATED"), ev(order, "ORDER_PAID")])
        except Exception as exc:            # recorded, asserted on at the end: the loop must keep measuring
            self.errors.append(f"{order}: {exc!r}")
            return time.monotonic() - started
        took = time.monotonic() - started
        self.orders.append(order)
        self.latencies.append(took)
        if [r.outcome for r in results] != ["applied", "applied"]:
            self.errors.append(f"{order}: {[(r.outcome, r.error, r.deferred) for r in results]}")
        return took

    async def run(self) -> None:
        while not self._stop.is_set():
            await self.batch()

    def stop(self) -> None:
        self._stop.set()

    def summary(self) -> str:
        lat = sorted(self.latencies)
        if not lat:
            return "no batches"
        q = statistics.quantiles(lat, n=100) if len(lat) > 1 else lat * 99
        slow = sum(1 for x in lat if x > 0.5)
        return (f"{len(lat)} batches: p50 {q[49] * 1000:.0f} ms, p90 {q[89] * 1000:.0f} ms, "
                f"p99 {q[98] * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms, {slow} over 500 ms")

    def assert_applied(self, db: ScratchDatabase) -> None:
        assert self.errors == [], self.errors[:5]
        statuses = {r["order_no"]: r["status"] for r in db.query(
            f"SELECT order_no, status FROM t_order WHERE order_no LIKE 'ORD-%%-{self.prefix}%%'")}
        assert {o: statuses.get(o) for o in self.orders} == {o: 2 for o in self.orders}     # every one paid


class LongTransaction:
    """A raw connection with a transaction that read t_idem and stays open: it holds the
    table's shared metadata lock until it ends, so a DROP PARTITION must wait for it."""

    def __init__(self, db: ScratchDatabase) -> None:
        self.conn = connect(db.url)
        self.opened_at: float | None = None
        self.closed_at: float | None = None

    async def open(self) -> None:
        def begin():
            self.conn.begin()
            with self.conn.cursor() as cur:
                cur.execute("SELECT COUNT(*) AS n FROM t_idem")
                cur.fetchall()
        await asyncio.to_thread(begin)
        self.opened_at = time.monotonic()

    async def hold(self, seconds: float | None, until: asyncio.Event) -> None:
        """Open, then end after ``seconds``, or (``None``) once ``until`` is set, within HOLD_LIMIT."""
        await self.open()
        try:
            if seconds is not None:
                await asyncio.sleep(seconds)
            else:
                await asyncio.wait_for(until.wait(), HOLD_LIMIT)
        finally:
            await self.end()

    async def end(self) -> None:
        if self.closed_at is None and self.conn.open:
            await asyncio.to_thread(self.conn.rollback)
            self.closed_at = time.monotonic()

    def close(self) -> None:
        """Whatever happened: a transaction left open would block DROP DATABASE for good."""
        self.conn.close()


@dataclass
class Episode:
    report: MaintenanceReport
    maintain_seconds: float
    held_seconds: float
    before: list
    after: list
    loop: PipelineLoop
    expected_drop: list[str]


async def drop_during_long_transaction(settings, db: ScratchDatabase, *, hold_seconds: int, tries: int,
                                       retry_delay: float, hold: float | None = None) -> Episode:
    """The pipeline runs batches in a loop; a transaction that read t_idem stays open ``hold``
    seconds (``None``: until the maintenance returns); meanwhile the maintenance tries to drop
    the months past the retention (today's date).

    Kept apart from the test so that it can be run by hand with a long lock wait, which
    must stall the pipeline for about as long as the transaction stays open."""
    retention = Retention(RETENTION_DAYS)
    insert_idem(db, month_start(utc_today(), -6) + timedelta(days=3))
    async with pipeline_on(settings, db) as harness, \
            partitions_on(settings, db, hold_seconds=hold_seconds, tries=tries,
                          retry_delay=retry_delay) as partitions:
        loop = PipelineLoop(await harness.processor(), prefix="PLW")
        for _ in range(3):                  # connections made, code paths warm
            await loop.batch()
        loop.latencies.clear()
        before = partition_bounds(db)
        expected_drop = droppable(before, retention.drop_before())
        assert expected_drop, f"nothing to drop before {retention.drop_before()}: {before}"

        long_tx = LongTransaction(db)
        running = asyncio.create_task(loop.run())
        holder = None
        try:
            await asyncio.sleep(0.3)
            maintained = asyncio.Event()
            holder = asyncio.create_task(long_tx.hold(hold, maintained))
            while long_tx.opened_at is None and not holder.done():
                await asyncio.sleep(0.01)
            started = time.monotonic()
            report = await maintain(partitions, retention=retention, ahead=AHEAD)
            maintain_seconds = time.monotonic() - started
            after = partition_bounds(db)        # read before the transaction ends
            maintained.set()
            await holder
            await asyncio.sleep(0.3)            # the pipeline after the episode, too
        finally:
            if holder is not None and not holder.done():
                holder.cancel()
            loop.stop()
            await running
            await long_tx.end()
            long_tx.close()
    return Episode(report, maintain_seconds, long_tx.closed_at - long_tx.opened_at, before, after, loop,
                   expected_drop)


# -------------------------------------------------------------------- tests --

def test_the_migration_converts_a_table_with_rows_and_downgrades_without_losing_them(fresh_db):
    db = fresh_db(migrated=False)
    db.migrate("0005")
    today = utc_today()
    days = [today - timedelta(days=730), month_start(today, -3) + timedelta(days=9), today,
            month_start(today, 2) + timedelta(days=27), today + timedelta(days=5 * 365)]
    keys = {insert_idem(db, day, prefix="MIG"): day for day in days}
    rows = snapshot(db)

    db.migrate("0006")
    migration_day = utc_today()
    this_month = month_start(migration_day)
    assert [name for name, _ in partition_bounds(db)] == (
        ["p_before"] + [month_name(month_start(this_month, m)) for m in range(-12, 4)] + [CATCH_ALL])
    assert snapshot(db) == rows
    where = {key: migration_partition(day, migration_day) for key, day in keys.items()}
    assert sorted(where.values()) == sorted(
        ["p_before", month_name(month_start(today, -3)), month_name(this_month), month_name(month_start(today, 2)),
         CATCH_ALL])
    for key, partition in where.items():
        assert key in keys_in(db, partition), f"{key} ({keys[key]}) not in {partition}"
    db.query("ANALYZE TABLE t_idem")
    counts = {r["PARTITION_NAME"]: r["TABLE_ROWS"] for r in db.query(
        "SELECT PARTITION_NAME, TABLE_ROWS FROM information_schema.PARTITIONS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 't_idem'")}
    assert {name for name, n in counts.items() if n} == set(where.values())

    for key, day in keys.items():                # a key lookup reads one partition
        [plan] = db.query("EXPLAIN PARTITIONS SELECT biz_key, status FROM t_idem WHERE biz_key = %s "
                          "AND part_date = %s", key, day)
        assert plan["partitions"] == where[key], plan

    db.migrate("0005", down=True)
    assert snapshot(db) == rows
    assert "PARTITION" not in db.query("SHOW CREATE TABLE t_idem")[0]["Create Table"].upper()
    assert [name for name, _ in partition_bounds(db)] == [None]


async def test_maintenance_adds_months_ahead_and_drops_the_months_past_the_retention(settings, fresh_db):
    db = fresh_db()
    migration_month = month_start(utc_today())
    fixed = month_start(migration_month, 6) + timedelta(days=14)
    retention = Retention(RETENTION_DAYS, today=lambda: fixed)
    drop_before = retention.drop_before()
    assert drop_before == fixed - timedelta(days=RETENTION_DAYS + 1)

    gone = [insert_idem(db, day) for day in (migration_month - timedelta(days=700),          # p_before
                                             month_start(migration_month, -5) + timedelta(days=9),
                                             month_start(migration_month, 1) + timedelta(days=9))]
    kept = {insert_idem(db, fixed - timedelta(days=80)): month_name(month_start(fixed - timedelta(days=80))),
            insert_idem(db, fixed): month_name(month_start(fixed)),                         # was in p_future
            insert_idem(db, month_start(migration_month, 8) + timedelta(days=2)):
                month_name(month_start(migration_month, 8)),
            insert_idem(db, fixed + timedelta(days=5 * 365)): CATCH_ALL}
    before = partition_bounds(db)

    async with partitions_on(settings, db, hold_seconds=2, tries=2, retry_delay=0.5) as partitions:
        report = await maintain(partitions, retention=retention, ahead=AHEAD, today=fixed)
        print(f"\nmaintenance on {fixed} (drop before {drop_before}): {report}")
        after = partition_bounds(db)

        assert report.failed == []
        assert report.added == [month_name(month_start(migration_month, m)) for m in range(4, 6 + AHEAD + 1)]
        assert report.dropped == droppable(before, drop_before)
        assert report.dropped[0] == "p_before" and report.dropped[-1] == month_name(month_start(fixed, -4))
        assert [name for name, _ in after] == [
            month_name(month_start(fixed, m)) for m in range(-3, AHEAD + 1)] + [CATCH_ALL]
        assert all(below > drop_before for _, below in after if below is not None)
        assert after[-2][1] == month_start(fixed, AHEAD + 1)            # fixed's month and 3 more are ready

        assert all_keys(db) == set(kept)
        for key, partition in kept.items():
            assert key in keys_in(db, partition), f"{key} not in {partition}"
        assert keys_in(db, CATCH_ALL) == {k for k, p in kept.items() if p == CATCH_ALL}

        again = await maintain(partitions, retention=retention, ahead=AHEAD, today=fixed)
        assert again == MaintenanceReport()
        assert partition_bounds(db) == after
    assert not set(gone) & all_keys(db)


async def test_a_long_transaction_postpones_the_drop_and_the_pipeline_never_waits_longer_than_the_lock_wait(
        settings, fresh_db):
    db = fresh_db()
    lock_wait = 2                # the longest the drop may hold the pipeline up (a lock_wait_timeout of 1 s)
    episode = await drop_during_long_transaction(settings, db, hold_seconds=lock_wait, tries=3, retry_delay=1)
    loop = episode.loop
    print(f"\nhold_seconds={lock_wait}: maintenance gave up after {episode.maintain_seconds:.2f} s, "
          f"transaction open {episode.held_seconds:.2f} s; pipeline {loop.summary()}")

    assert episode.report.dropped == [] and episode.report.added == []
    assert len(episode.report.failed) == 1 and episode.report.failed[0].startswith("drop:")
    assert "no metadata lock in 3 tries" in episode.report.failed[0]        # LockNotGranted
    assert episode.after == episode.before                                  # every partition still there
    assert episode.maintain_seconds < episode.held_seconds < HOLD_LIMIT
    assert len(loop.latencies) >= 20, loop.summary()                         # it kept running while the drop waited
    assert max(loop.latencies) <= lock_wait + LATENCY_SLACK, loop.summary()
    loop.assert_applied(db)

    # The transaction has ended: the next tick drops them.
    async with partitions_on(settings, db, hold_seconds=lock_wait, tries=3, retry_delay=1) as partitions:
        report = await maintain(partitions, retention=Retention(RETENTION_DAYS), ahead=AHEAD)
    assert report.failed == [] and report.dropped == episode.expected_drop
    assert not set(report.dropped) & {name for name, _ in partition_bounds(db)}


async def test_a_drop_while_the_pipeline_writes_to_the_current_month_costs_it_next_to_nothing(settings, fresh_db):
    db = fresh_db()
    today = utc_today()
    retention = Retention(RETENTION_DAYS)
    old = [insert_idem(db, month_start(today, m) + timedelta(days=4), prefix="OLD") for m in (-11, -8, -6)]
    expected = droppable(partition_bounds(db), retention.drop_before())

    async with pipeline_on(settings, db) as harness, \
            partitions_on(settings, db, hold_seconds=1, tries=3, retry_delay=1) as partitions:
        loop = PipelineLoop(await harness.processor(), prefix="PCW")
        for _ in range(3):
            await loop.batch()
        loop.latencies.clear()
        running = asyncio.create_task(loop.run())
        try:
            await asyncio.sleep(0.5)
            started = time.monotonic()
            report = await maintain(partitions, retention=retention, ahead=AHEAD)
            took = time.monotonic() - started
            await asyncio.sleep(0.5)
        finally:
            loop.stop()
            await running
    print(f"\ndrop of {len(report.dropped)} partitions took {took * 1000:.0f} ms; pipeline {loop.summary()}")

    assert report.failed == [] and report.dropped == expected
    assert not set(old) & all_keys(db)
    assert {o.split(":")[0] for o in keys_in(db, month_name(month_start(today)))} >= set(loop.orders)
    loop.assert_applied(db)
    # A batch behind the drop waits at most its lock wait (hold_seconds=1); the slack is the
    # machine's, not the drop's (a loaded 2-core machine once took 1.04 s over a batch).
    assert max(loop.latencies) <= 1 + LATENCY_SLACK, loop.summary()
