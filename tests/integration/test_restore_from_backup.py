"""A restore from backup: the store goes back minutes, the group is rewound to the beginning, and
the replay issues no second waybill and sends no second SMS, whether a person opened the recovery
window or nobody did.

A logical backup (``mariadb-dump --single-transaction``) is taken while a real worker is in the
middle of a run; the run finishes; the backup is restored into the same server (every ``t_idem``
row written after it is forgotten; the server's identity does not change); the group's offsets go
back to 0; a worker replays everything. The tokens are derived from the steps, so the logistics
API answers each replayed waybill with the one it issued; in a recovery window each SMS the store
has no row of, or holds pending, is looked up first, and found sent. The window is opened by a
person (``faust -A app recovery start``), or by the workers themselves: the store's watermark
they advanced and published to Kafka after the backup is above the restored one.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from app.pipeline.states import OrderStatus
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import ROOT, ScratchDatabase, caught_up, produce, rewind_group, wait_for, worker_env

FAUST = Path(sys.executable).parent / "faust"
ORDERS = 40                 # half confirmed (a waybill each), half cancelled (an SMS each)
SETTINGS = {"SMS_LOOKUP": "true", "SMS_LOOKUP_SETTLE_SECONDS": "1", "BATCH_SIZE": "10",
            "BATCH_WITHIN_SECONDS": "0.2", "DLQ_RETRY_AFTER_SECONDS": "1", "COMPENSATION_TIMER_SECONDS": "0.5",
            "COMPENSATION_BACKOFF_SECONDS": "1", "COMPENSATION_BACKOFF_MAX_SECONDS": "2"}


def client_args(url: str) -> list[str]:
    u = urlsplit(url)
    return ["-h", u.hostname or "127.0.0.1", "-P", str(u.port or 3306), "-u", u.username or "",
            f"-p{u.password or ''}", u.path.lstrip("/")]


@pytest.fixture
def db(settings):
    scratch = ScratchDatabase(settings.database.url).create()
    yield scratch
    scratch.drop()


@pytest.fixture
def fakes():
    process = FakesProcess({"waybill": {"latency_ms": 20}, "sms": {"latency_ms": 20}})
    yield process
    process.stop()


class Run:
    """Orders created and paid, then confirmed or cancelled, with a backup of the store taken in
    the middle; the restore and the replay."""

    def __init__(self, settings, topics, spawn_worker, db, fakes, tmp_path, **overrides) -> None:
        self.settings, self.spawn_worker, self.db, self.fakes = settings, spawn_worker, db, fakes
        self.pair = topics(partitions=2)
        self.confirmed = [order_no(prefix="RST") for _ in range(ORDERS // 2)]
        self.cancelled = [order_no(prefix="RST") for _ in range(ORDERS // 2)]
        self.docs = [event(o, t) for o in self.confirmed + self.cancelled for t in ("ORDER_CREATED", "ORDER_PAID")]
        for confirm, cancel in zip(self.confirmed, self.cancelled):      # waybills and SMS all through the run
            self.docs += [event(confirm, "ORDER_CONFIRM"), event(cancel, "ORDER_CANCEL")]
        self.env = {"MYSQL_URL": db.url, **fakes.env(), **SETTINGS, **overrides}
        self.backup = tmp_path / "backup.sql"

    def effects(self) -> tuple[dict, dict]:
        ledger = self.fakes.ledger()
        return ledger["waybills"], ledger["sms"]

    def done(self, worker) -> None:
        pair = self.pair
        wait_for(lambda: caught_up(self.settings, pair.events, pair.group, pair.partitions), timeout=180,
                 what="the records done", workers=[worker])

    def first_run(self):
        """The run, with the backup taken in its middle; the worker, still running."""
        worker = self.spawn_worker(self.pair, name="first", **self.env)
        half = len(self.docs) - ORDERS // 2                  # every order created and paid, half its effects
        asyncio.run(produce(self.settings, self.pair.events, [record(d) for d in self.docs[:half]]))
        self.done(worker)
        with self.backup.open("wb") as out:                   # the worker runs on: the middle of a run
            subprocess.run(["mariadb-dump", "--single-transaction", *client_args(self.db.url)], stdout=out, check=True)
        self.backed_up = self.db.scalar("SELECT watermark FROM t_store_server WHERE id = 1")
        asyncio.run(produce(self.settings, self.pair.events, [record(d) for d in self.docs[half:]]))
        self.done(worker)
        waybills, sms = self.effects()
        assert sorted(waybills) == sorted(self.confirmed) and sorted(sms) == sorted(self.cancelled)
        return worker

    def restore(self) -> None:
        db = self.db
        rows_before = db.scalar("SELECT COUNT(*) FROM t_idem")
        confirmed_rows = db.scalar("SELECT COUNT(*) FROM t_idem WHERE step = 'issue_waybill'")
        cancelled_rows = db.scalar("SELECT COUNT(*) FROM t_idem WHERE step = 'send_cancel_sms'")
        with self.backup.open("rb") as dump:
            subprocess.run(["mariadb", *client_args(db.url)], stdin=dump, check=True)
        forgotten = rows_before - db.scalar("SELECT COUNT(*) FROM t_idem")
        lost_waybills = confirmed_rows - db.scalar("SELECT COUNT(*) FROM t_idem WHERE step = 'issue_waybill'")
        lost_sms = cancelled_rows - db.scalar("SELECT COUNT(*) FROM t_idem WHERE step = 'send_cancel_sms'")
        print(f"the restore forgot {forgotten} of {rows_before} t_idem rows: {lost_waybills} waybill steps, "
              f"{lost_sms} SMS steps")
        assert lost_waybills > 0 and lost_sms > 0, "the backup does not fall in the middle of the run"

    def replay(self) -> None:
        pair, db = self.pair, self.db
        asyncio.run(rewind_group(self.settings, pair.group, pair.events, pair.partitions))
        replay = self.spawn_worker(pair, name="replay", **self.env)

        def settled() -> bool:
            statuses = {r["order_no"]: r["status"] for r in db.query("SELECT order_no, status FROM t_order")}
            unsettled = db.scalar("SELECT COUNT(*) FROM t_compensation WHERE status IN (1, 2)")
            return (caught_up(self.settings, pair.events, pair.group, pair.partitions) and unsettled == 0
                    and all(statuses.get(o) == OrderStatus.CONFIRMED for o in self.confirmed)
                    and all(statuses.get(o) == OrderStatus.CANCELLED for o in self.cancelled))

        wait_for(settled, timeout=180, what="the replay done, every order in its final state", workers=[replay])

    def assert_nothing_twice(self) -> None:
        waybills, sms = self.effects()
        twice = {o: len(w) for o, w in waybills.items() if len(w) != 1}
        assert not twice, f"{sum(twice.values()) - len(twice)} second waybills for {len(twice)} orders"
        twice = {o: len(m) for o, m in sms.items() if len(m) != 1}
        assert not twice, f"{sum(twice.values()) - len(twice)} second SMS for {len(twice)} orders"
        assert sorted(waybills) == sorted(self.confirmed) and sorted(sms) == sorted(self.cancelled)
        assert self.db.scalar("SELECT COUNT(*) FROM t_compensation WHERE status = 4") == 0   # nothing for a person
        lookups = [c for c in self.fakes.ledger()["calls"] if c["service"] == "sms_lookup"]
        assert lookups, "the replay never asked the gateway"

    def windows(self) -> list[dict]:
        return self.db.query("SELECT opened_by, reason FROM t_recovery_window ORDER BY id")


def test_a_replay_after_a_restore_from_backup_issues_and_sends_nothing_twice(settings, topics, spawn_worker, db,
                                                                              fakes, tmp_path):
    run = Run(settings, topics, spawn_worker, db, fakes, tmp_path)
    assert run.first_run().stop() == 0
    run.restore()
    opened = subprocess.run([str(FAUST), "-A", "app", "recovery", "start", "--hours", "1", "--note",
                             "restored the backup taken mid-run", "--actor", "test"], cwd=ROOT,
                            env=worker_env(**run.env, **run.pair.env()), capture_output=True, text=True, timeout=120)
    assert opened.returncode == 0, opened.stderr
    run.replay()
    run.assert_nothing_twice()


def test_a_restore_nobody_announces_opens_its_window_before_the_first_replayed_batch(settings, topics, spawn_worker,
                                                                                     db, fakes, tmp_path):
    """Nobody runs ``recovery start``: the replaying worker finds the store's watermark below the
    one its predecessor published after the backup (its last advance at its clean stop, at the
    latest), and opens the window itself before its first batch."""
    run = Run(settings, topics, spawn_worker, db, fakes, tmp_path)
    assert run.first_run().stop() == 0
    run.restore()
    assert run.windows() == []
    run.replay()
    [window] = run.windows()
    assert window["opened_by"].startswith("worker:") and "went back in time" in window["reason"], window
    assert f"its watermark is {run.backed_up}," in window["reason"]
    run.assert_nothing_twice()


def test_a_restore_under_a_running_worker_is_noticed_at_its_next_advance(settings, topics, spawn_worker, db, fakes,
                                                                          tmp_path):
    """The database restored while the worker runs on (no stop, no new connection needed): its next
    advance of the watermark finds the store behind what it published, and opens the window."""
    run = Run(settings, topics, spawn_worker, db, fakes, tmp_path, STORE_WATERMARK_SECONDS="1")
    worker = run.first_run()
    wait_for(lambda: db.scalar("SELECT watermark FROM t_store_server WHERE id = 1") > run.backed_up + 1, timeout=60,
             what="an advance after the backup", workers=[worker])
    run.restore()
    wait_for(run.windows, timeout=60, what="the worker to notice the restore", workers=[worker])
    [window] = run.windows()
    assert window["opened_by"].startswith("worker:") and "went back in time" in window["reason"], window
    worker.wait_log("the store went back in time", timeout=10)
    assert worker.stop() == 0
    run.replay()
    run.assert_nothing_twice()
