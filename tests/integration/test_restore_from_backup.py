"""A restore from backup: the store goes back minutes, the group is rewound to the beginning, and
the replay, in a recovery window, issues no second waybill and sends no second SMS.

A logical backup (``mariadb-dump --single-transaction``) is taken while a real worker is in the
middle of a run; the run finishes; the worker stops; the backup is restored (every ``t_idem`` row
written after it is forgotten); the group's offsets go back to 0; a person opens the recovery
window (``faust -A app recovery start``); a worker replays everything. The tokens are derived
from the steps, so the logistics API answers each replayed waybill with the one it issued; the
window makes each fresh SMS claim ask the gateway first, which finds the message sent.
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

pytestmark = pytest.mark.integration
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
    scratch = ScratchDatabase(settings.mysql_url).create()
    yield scratch
    scratch.drop()


@pytest.fixture
def fakes():
    process = FakesProcess({"waybill": {"latency_ms": 20}, "sms": {"latency_ms": 20}})
    yield process
    process.stop()


def test_a_replay_after_a_restore_from_backup_issues_and_sends_nothing_twice(settings, topics, spawn_worker, db,
                                                                              fakes, tmp_path):
    pair = topics(partitions=2)
    confirmed = [order_no(prefix="RST") for _ in range(ORDERS // 2)]
    cancelled = [order_no(prefix="RST") for _ in range(ORDERS // 2)]
    docs = [event(o, t) for o in confirmed + cancelled for t in ("ORDER_CREATED", "ORDER_PAID")]
    for confirm, cancel in zip(confirmed, cancelled):      # waybills and SMS all through the run
        docs += [event(confirm, "ORDER_CONFIRM"), event(cancel, "ORDER_CANCEL")]
    env = {"MYSQL_URL": db.url, **fakes.env(), **SETTINGS}

    def effects() -> tuple[dict, dict]:
        ledger = fakes.ledger()
        return ledger["waybills"], ledger["sms"]

    worker = spawn_worker(pair, name="first", **env)
    half = len(docs) - ORDERS // 2                  # every order created and paid, half its effects
    asyncio.run(produce(settings, pair.events, [record(d) for d in docs[:half]]))
    wait_for(lambda: caught_up(settings, pair.events, pair.group, pair.partitions), timeout=180,
             what="the first half done", workers=[worker])
    backup = tmp_path / "backup.sql"
    with backup.open("wb") as out:                   # the worker runs on: the middle of a run
        subprocess.run(["mariadb-dump", "--single-transaction", *client_args(db.url)], stdout=out, check=True)
    asyncio.run(produce(settings, pair.events, [record(d) for d in docs[half:]]))
    wait_for(lambda: caught_up(settings, pair.events, pair.group, pair.partitions), timeout=180,
             what="the run done", workers=[worker])
    waybills, sms = effects()
    assert sorted(waybills) == sorted(confirmed) and sorted(sms) == sorted(cancelled)
    rows_before = db.scalar("SELECT COUNT(*) FROM t_idem")
    confirmed_rows = db.scalar("SELECT COUNT(*) FROM t_idem WHERE step = 'issue_waybill'")
    cancelled_rows = db.scalar("SELECT COUNT(*) FROM t_idem WHERE step = 'send_cancel_sms'")
    assert worker.stop() == 0

    with backup.open("rb") as dump:
        subprocess.run(["mariadb", *client_args(db.url)], stdin=dump, check=True)
    forgotten = rows_before - db.scalar("SELECT COUNT(*) FROM t_idem")
    lost_waybills = confirmed_rows - db.scalar("SELECT COUNT(*) FROM t_idem WHERE step = 'issue_waybill'")
    lost_sms = cancelled_rows - db.scalar("SELECT COUNT(*) FROM t_idem WHERE step = 'send_cancel_sms'")
    print(f"the restore forgot {forgotten} of {rows_before} t_idem rows: {lost_waybills} waybill steps, "
          f"{lost_sms} SMS steps")
    assert lost_waybills > 0 and lost_sms > 0, "the backup does not fall in the middle of the run"
    asyncio.run(rewind_group(settings, pair.group, pair.events, pair.partitions))
    opened = subprocess.run([str(FAUST), "-A", "app", "recovery", "start", "--hours", "1", "--note",
                             "restored the backup taken mid-run", "--actor", "test"], cwd=ROOT,
                            env=worker_env(**env, **pair.env()), capture_output=True, text=True, timeout=120)
    assert opened.returncode == 0, opened.stderr

    replay = spawn_worker(pair, name="replay", **env)

    def settled() -> bool:
        statuses = {r["order_no"]: r["status"] for r in db.query("SELECT order_no, status FROM t_order")}
        unsettled = db.scalar("SELECT COUNT(*) FROM t_compensation WHERE status IN (1, 2)")
        return (caught_up(settings, pair.events, pair.group, pair.partitions) and unsettled == 0
                and all(statuses.get(o) == OrderStatus.CONFIRMED for o in confirmed)
                and all(statuses.get(o) == OrderStatus.CANCELLED for o in cancelled))

    wait_for(settled, timeout=180, what="the replay done, every order in its final state", workers=[replay])
    waybills, sms = effects()
    twice = {o: len(w) for o, w in waybills.items() if len(w) != 1}
    assert not twice, f"{sum(twice.values()) - len(twice)} second waybills for {len(twice)} orders"
    twice = {o: len(m) for o, m in sms.items() if len(m) != 1}
    assert not twice, f"{sum(twice.values()) - len(twice)} second SMS for {len(twice)} orders"
    assert sorted(waybills) == sorted(confirmed) and sorted(sms) == sorted(cancelled)
    assert db.scalar("SELECT COUNT(*) FROM t_compensation WHERE status = 4") == 0     # nothing left for a person
    lookups = [c for c in fakes.ledger()["calls"] if c["service"] == "sms_lookup"]
    assert lookups, "the replay never asked the gateway"
