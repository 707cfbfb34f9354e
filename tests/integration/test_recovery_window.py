"""Recovery windows: opened by a person from the CLI, or by the first connection that finds the
store on another database server than it last recorded (a failover, a restore onto a new
server); ended by a person; every open and end kept with who and why."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from app.adapters.mysql import MySqlStore
from app.adapters.mysql.engine import create_engine
from app.adapters.mysql.recovery import Remembered
from app.adapters.mysql.recovery_windows import RecoveryWindows
from app.observability import metrics
from harness.services import ROOT, ScratchDatabase, worker_env

FAUST = Path(sys.executable).parent / "faust"


@pytest.fixture
def db(settings):
    scratch = ScratchDatabase(settings.database.url).create()
    yield scratch
    scratch.drop()


async def connect_once(settings, url: str, n: int = 1, remembered: int = 0) -> None:
    """Open ``n`` new connections at once (each runs the server check, against a watermark this
    process knows the store reached), then close them."""
    known = Remembered()
    known.see(remembered)
    engine = create_engine(settings, url=url, pool_size=n, max_overflow=0, remembered=known)
    try:
        async def one() -> None:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
                await asyncio.sleep(0.2)            # hold it: the others must open their own
        await asyncio.gather(*(one() for _ in range(n)))
    finally:
        await engine.dispose()


def windows(db) -> list[dict]:
    return db.query("SELECT * FROM t_recovery_window ORDER BY id")


async def test_the_first_connection_records_the_server_and_opens_no_window(settings, db):
    await connect_once(settings, db.url)
    server = db.scalar("SELECT server FROM t_store_server WHERE id = 1")
    variables = {r["Variable_name"]: r["Value"] for r in db.query("SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                                                                 "('hostname', 'port', 'server_id')")}
    assert server == f"{variables['hostname']}:{variables['port']}#{variables['server_id']}"
    await connect_once(settings, db.url)
    assert windows(db) == []


async def test_a_connection_to_another_server_opens_a_window_and_records_the_new_server(settings, db, caplog):
    await connect_once(settings, db.url)
    here = db.scalar("SELECT server FROM t_store_server WHERE id = 1")
    # What a replica holds after a failover: the identity the old primary recorded.
    db.query("UPDATE t_store_server SET server = 'old-primary:3306#1' WHERE id = 1")
    before = metrics.STORE_SERVER_CHANGES._value.get()
    with caplog.at_level(logging.WARNING, logger="app.adapters.mysql.engine"):
        await connect_once(settings, db.url, n=4)
    [window] = windows(db)
    assert window["opened_by"] == f"worker:{settings.worker_id}" and window["ended_at"] is None
    assert "old-primary:3306#1" in window["reason"] and here in window["reason"]
    hours = (window["ends_at"] - window["opened_at"]).total_seconds() / 3600
    assert abs(hours - settings.database.recovery_auto_hours) < 0.01
    assert db.scalar("SELECT server FROM t_store_server WHERE id = 1") == here
    assert metrics.STORE_SERVER_CHANGES._value.get() == before + 1
    [line] = [r.getMessage() for r in caplog.records if "database server changed" in r.getMessage()]
    assert f"recovery window {window['id']} is open" in line
    await connect_once(settings, db.url, n=2)
    assert len(windows(db)) == 1


async def test_the_check_can_be_turned_off(settings, db):
    await connect_once(settings, db.url)
    db.query("UPDATE t_store_server SET server = 'old-primary:3306#1' WHERE id = 1")
    await connect_once(settings.model_copy(update={"db_server_check": False}), db.url)
    assert windows(db) == []


async def test_a_connection_to_a_store_back_in_time_opens_one_window_and_records_how_far_it_had_come(settings, db,
                                                                                                     caplog):
    """The same server, restored from a backup: its watermark is below the one this process read
    from Kafka. The first of four connections to notice opens the window and moves the watermark
    up to it; the others, and later connections, open none."""
    await connect_once(settings, db.url)
    db.query("UPDATE t_store_server SET watermark = 40 WHERE id = 1")
    before = metrics.STORE_WENT_BACK._value.get()
    with caplog.at_level(logging.WARNING, logger="app.adapters.mysql.recovery"):
        await connect_once(settings, db.url, n=4, remembered=75)
    [window] = windows(db)
    assert window["opened_by"] == f"worker:{settings.worker_id}"
    assert "went back in time: its watermark is 40, below the 75" in window["reason"]
    assert "server changed" not in window["reason"]
    assert db.scalar("SELECT watermark FROM t_store_server WHERE id = 1") == 75
    assert metrics.STORE_WENT_BACK._value.get() == before + 1
    [line] = [r.getMessage() for r in caplog.records if "went back in time" in r.getMessage()]
    assert f"recovery window {window['id']} is open" in line
    await connect_once(settings, db.url, n=2, remembered=75)
    assert len(windows(db)) == 1


async def test_advances_move_the_store_past_what_was_remembered_and_open_one_window_when_it_was_behind(settings, db):
    """Every advance moves the watermark one past the higher of the store's and the remembered one;
    of workers advancing at once over a store found behind, one opens the window."""
    await connect_once(settings, db.url)
    engine = create_engine(settings, url=db.url, pool_size=8, max_overflow=0)
    windows_ = RecoveryWindows(MySqlStore(engine))
    try:
        first = await windows_.advance(remembered=0, worker_id="w1", hours=1)
        second = await windows_.advance(remembered=first.watermark, worker_id="w1", hours=1)
        assert (first.change, second.change, second.watermark) == (None, None, first.watermark + 1)
        assert windows(db) == []
        db.query("UPDATE t_store_server SET watermark = 1 WHERE id = 1")        # a restore
        results = await asyncio.gather(*(windows_.advance(remembered=50, worker_id=f"w{i}", hours=1)
                                         for i in range(6)))
    finally:
        await engine.dispose()
    opened = [r.change for r in results if r.change is not None]
    assert len(opened) == 1 and opened[0].behind == (1, 50)
    assert sorted(r.watermark for r in results) == list(range(51, 57))
    [window] = windows(db)
    assert window["id"] == opened[0].window_id and "its watermark is 1, below the 50" in window["reason"]


def recovery(db, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(FAUST), "-A", "app", "recovery", *args], cwd=ROOT, capture_output=True, text=True,
                          env=worker_env(MYSQL_URL=db.url), timeout=120)


def test_a_person_opens_shows_and_ends_a_window_from_the_cli(db):
    refused = recovery(db, "start", "--hours", "2", "--actor", "alice")
    assert refused.returncode != 0 and "needs --note" in refused.stderr
    started = recovery(db, "start", "--hours", "2", "--note", "restored the 02:00 backup", "--actor", "alice")
    assert started.returncode == 0, started.stderr
    opened = json.loads(started.stdout)["opened"]
    assert opened["open"] and opened["opened_by"] == "cli:alice" and opened["reason"] == "restored the 02:00 backup"
    status = json.loads(recovery(db, "status").stdout)
    assert status["open"] and [w["id"] for w in status["windows"]] == [opened["id"]]
    ended = recovery(db, "end", "--note", "replayed from the start", "--actor", "bob")
    assert ended.returncode == 0, ended.stderr
    [row] = windows(db)
    assert (row["ended_by"], row["end_note"]) == ("cli:bob", "replayed from the start") and row["ended_at"]
    assert not json.loads(recovery(db, "status").stdout)["open"]
    again = recovery(db, "end", "--note", "twice", "--actor", "bob")
    assert again.returncode != 0 and "no recovery window was open" in again.stderr
