"""The reconcile (``faust -A app reconcile``) against a real worker's run: a clean range is accounted
for record by record; then what production loses is found, each with its evidence and nothing else:
a ``t_idem`` row deleted by hand, a waybill receipt deleted by hand, and the seed's lost CANCEL (the
group committed past it while no worker read it). The timer runs it under its lease: two workers,
one run at a time."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import ROOT, caught_up, commit_group, end_offsets, produce, wait_for

FAUST = Path(sys.executable).parent / "faust"


def reconcile(worker, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(FAUST), "-A", "app", "reconcile", *args], cwd=ROOT, capture_output=True, text=True,
                          env=worker.env, timeout=180)


def around(began: datetime) -> list[str]:
    return ["--from", (began - timedelta(minutes=1)).isoformat(),
            "--to", (datetime.now(UTC) + timedelta(minutes=1)).isoformat()]


def test_a_clean_range_is_accounted_and_what_was_lost_is_found(settings, topics, spawn_worker, own_db):
    pair = topics(partitions=3)
    fakes = FakesProcess()
    try:
        worker = spawn_worker(pair, "a", **fakes.env(), RECONCILE_EVERY_SECONDS="0", MYSQL_URL=own_db.url)
        began = datetime.now(UTC)
        orders = [order_no(prefix="REC") for _ in range(12)]
        docs = []
        for i, order in enumerate(orders):
            docs += [event(order, "ORDER_CREATED"), event(order, "ORDER_PAID"),
                     event(order, "ORDER_CONFIRM" if i % 2 else "ORDER_CANCEL")]
        again = [docs[0], docs[4]]                                 # exact duplicates
        records = [record(d) for d in docs + again]
        records += [(orders[0].encode(), json.dumps({**docs[0], "type": "ORDER_SHIPPED"}).encode()),   # skipped
                    (orders[1].encode(), b"{not json")]                                                  # malformed
        asyncio.run(produce(settings, pair.events, records))
        wait_for(lambda: caught_up(settings, pair.events, pair.group, pair.partitions), timeout=120,
                 what="every record committed", workers=[worker])

        clean = reconcile(worker, *around(began), "--json")
        assert clean.returncode == 0, clean.stdout + clean.stderr
        report = json.loads(clean.stdout)
        assert report["status"] == "clean" and report["records"] == len(records)
        assert {k: v for k, v in report["ends"].items() if v} == {"done": 36, "duplicate": 2, "skipped": 1,
                                                                  "dead_letter": 1}

        # What production loses, each by hand.
        confirmed, cancelled, created = orders[1], orders[2], orders[3]
        own_db.query("DELETE FROM t_idem WHERE biz_key = %s", f"{created}:ORDER_CREATED:create_order")
        own_db.query("DELETE FROM t_waybill_receipt WHERE order_no = %s", confirmed)
        worker.stop()
        lost_cancel = order_no(prefix="REC")
        asyncio.run(produce(settings, pair.events, [record(event(lost_cancel, "ORDER_CANCEL"))]))
        ends = asyncio.run(end_offsets(settings, pair.events, pair.partitions))
        asyncio.run(commit_group(settings, pair.group, pair.events, ends))        # read past, never done

        found = reconcile(worker, *around(began), "--json")
        assert found.returncode == 1, found.stdout + found.stderr
        report = json.loads(found.stdout)
        findings = {(f["kind"], f["order_no"], f["type"]) for f in report["findings"]}
        assert findings == {("unaccounted", created, "ORDER_CREATED"),
                            ("receipt_mismatch", confirmed, "ORDER_CONFIRM"),
                            ("unaccounted", lost_cancel, "ORDER_CANCEL")}, report["findings"]
        assert report["findings_by_kind"] == {"unaccounted": 2, "stuck": 0, "receipt_mismatch": 1,
                                              "ledger_without_record": 0}
        evidence = next(f for f in report["findings"] if f["order_no"] == created)
        assert "no t_idem row" in evidence["why"] and evidence["steps"][0] == {
            "key": f"{created}:ORDER_CREATED:create_order", "row": None}
        assert cancelled not in {f["order_no"] for f in report["findings"]}
        # The receipt deleted by hand, seen from the provider's side too: its waybill has no receipt here.
        assert [(f["kind"], f["order_no"]) for f in report["providers"]["findings"]] == [("orphan", confirmed)]
        assert report["findings_total"] == 4 and report["providers"]["effects"]["sms"]["not_listable"]

        text = reconcile(worker, *around(began))
        assert text.returncode == 1 and "FINDINGS: 4 (2 unaccounted, 1 receipt_mismatch, 1 provider)" in text.stdout
        assert lost_cancel in text.stdout and f"provider orphan: waybill of {confirmed}" in text.stdout
        runs = json.loads(reconcile(worker, "--runs").stdout)
        assert [r["status"] for r in runs[:3]] == ["findings", "findings", "clean"]
        assert all(r["started_by"].startswith("cli:") for r in runs)
    finally:
        fakes.stop()


def test_the_timer_reconciles_its_window_one_worker_at_a_time(settings, topics, spawn_worker, own_db):
    pair = topics(partitions=2)
    fakes = FakesProcess()
    try:
        timer = {"RECONCILE_EVERY_SECONDS": "1", "RECONCILE_WINDOW_SECONDS": "600", "RECONCILE_LAG_SECONDS": "0"}
        own_db.query("INSERT INTO t_reconcile_run (consumer_group, topic, range_from, range_to, started_by, started_at, "
                         "finished_at, status) VALUES (%s, %s, NOW(3) - INTERVAL 42 DAY, NOW(3) - INTERVAL 41 DAY, "
                         "'timer:old', NOW(3) - INTERVAL 40 DAY, NOW(3) - INTERVAL 40 DAY, 'clean')",
                         pair.group, pair.events)
        workers = [spawn_worker(pair, name, **fakes.env(), **timer, MYSQL_URL=own_db.url) for name in ("a", "b")]
        order = order_no(prefix="RECT")
        asyncio.run(produce(settings, pair.events, [record(event(order, "ORDER_CREATED"))]))

        def runs():
            return own_db.query("SELECT started_by, started_at, finished_at, status, records FROM t_reconcile_run "
                                    "WHERE consumer_group = %s AND finished_at IS NOT NULL ORDER BY id", pair.group)
        wait_for(lambda: len(runs()) >= 6 and runs()[-1]["records"] >= 1, timeout=120,
                 what="six timed runs, the latest with the record", workers=workers)
        done = runs()
        assert all(r["started_by"].startswith("timer:") and r["status"] in ("clean", "findings") for r in done)
        assert "timer:old" not in {r["started_by"] for r in done}          # past RECONCILE_KEEP_DAYS: deleted
        # The lease: no two runs at once, whichever worker ran them.
        for earlier, later in zip(done, done[1:]):
            assert later["started_at"] >= earlier["finished_at"], (earlier, later)
        assert done[-1]["status"] == "clean"
    finally:
        fakes.stop()
