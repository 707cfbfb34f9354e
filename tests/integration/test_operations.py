"""Operations against real MariaDB (and, at the end, real workers): the stuck sweep and its
alerts, the gauges that live in the database, and refusal of events past the retention."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import REGISTRY

from app.adapters.alerts import AlertWebhook
from app.adapters.mysql import MySqlStore
from app.adapters.mysql.engine import create_engine
from app.adapters.mysql.reads.backlog import Watch
from app.pipeline.states import LedgerStatus as Status
from app.timers.stuck import Sweep
from harness import sql_modes
from harness.alerts import AlertReceiver
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import ROOT, ScratchDatabase, produce, wait_for

# Every database test here runs under the server's sql_mode and under MySQL 8's.
settings, scratch_db = sql_modes.each_sql_mode()

GROUP = "ops-group"
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture(scope="module")
def ops_db(settings):
    """A database of its own: the sweep reads every pending row, and others' tests leave some."""
    db = ScratchDatabase(settings.database.url, sql_mode=settings.database.sql_mode).create()
    yield db
    db.drop()


def plant(db: ScratchDatabase, *, stuck: int, prefix: str) -> dict[str, list[str]]:
    """Pending rows 20 minutes old (stuck), one claimed 20 times, fresh pending rows and old done ones;
    dead letters of GROUP open for 2 hours, open for a minute, manual for 3 hours, settled, and
    one of another group."""
    old = datetime.now(UTC).replace(tzinfo=None) - timedelta(minutes=20)
    keys = {"stuck": [f"{order_no(prefix=prefix)}:ORDER_CONFIRM:issue_waybill" for _ in range(stuck)],
            "capped": [f"{order_no(prefix=prefix)}:ORDER_CANCEL:send_sms"],
            "fresh": [f"{order_no(prefix=prefix)}:ORDER_CONFIRM:issue_waybill" for _ in range(3)],
            "done": [f"{order_no(prefix=prefix)}:ORDER_CONFIRM:issue_waybill" for _ in range(5)]}
    rows = ([(k, "issue_waybill", 1, 1, old - timedelta(seconds=i)) for i, k in enumerate(keys["stuck"])]
            + [(keys["capped"][0], "send_sms", 1, 20, old)]
            + [(k, "issue_waybill", 1, 1, None) for k in keys["fresh"]]
            + [(k, "issue_waybill", 2, 1, old) for k in keys["done"]])
    for key, step, status, attempt, modified in rows:
        db.query("INSERT INTO t_idem (biz_key, part_date, step, status, attempt, owner, lease_until, idem_token, "
                 "payload_hash, gmt_modified) VALUES (%s, CURDATE(), %s, %s, %s, 'gone-1/main/x', %s, 'tok', 'h', "
                 "COALESCE(%s, NOW(3)))", key, step, status, attempt, old, modified)
    letters = [(GROUP, Status.OPEN, 7200, "effect_unavailable"), (GROUP, Status.RETRYING, 7100, "lease_held"),
               (GROUP, Status.OPEN, 60, "effect_unavailable"), (GROUP, Status.MANUAL, 10800, "payload_mismatch"),
               (GROUP, Status.COMPENSATED, 20000, "effect_unavailable"), ("other", Status.OPEN, 9000, "x")]
    for offset, (group, status, age, reason) in enumerate(letters):
        db.query("INSERT INTO t_compensation (src_topic, src_partition, src_offset, consumer_group, order_no, status, "
                 "reason, message, retriable, attempts, first_failure_at) VALUES ('order-event', 0, %s, %s, %s, %s, "
                 "%s, 'planted', 1, 1, NOW(3) - INTERVAL %s SECOND)", offset + 1000 * len(keys["stuck"]), group,
                 order_no(prefix=prefix), int(status), reason, age)
    return keys


def ledger_ids(db: ScratchDatabase, status: Status, group: str = GROUP) -> list[int]:
    return [r["id"] for r in db.query("SELECT id FROM t_compensation WHERE status = %s AND consumer_group = %s "
                                      "ORDER BY first_failure_at", int(status), group)]


def metric(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_the_sweep_reports_each_stuck_row_and_overdue_dead_letter_in_alertmanager_format(settings, ops_db,
                                                                                             caplog):
    db = ops_db
    db.query("DELETE FROM t_idem")
    db.query("DELETE FROM t_compensation")
    keys = plant(db, stuck=250, prefix="SWEEP")
    receiver = AlertReceiver()
    engine = create_engine(settings, url=db.url)
    session = aiohttp.ClientSession()
    try:
        webhook = AlertWebhook(session, receiver.url, receiver=GROUP, external_url="http://desk:6066",
                               timeout_seconds=5, resend_seconds=300)
        sweep = Sweep(Watch(MySqlStore(engine)), group=GROUP, stuck_after=600, attempt_cap=20, sla=1800, limit=1000,
                      console_url="http://desk:6066", webhook=webhook, sweeper="desk-1")
        alerts_before = metric("order_alerts_total", alertname="IdemPendingStuck")
        with caplog.at_level(logging.WARNING, logger="app"):
            report = await sweep.run()
        assert (report.stuck, report.over_cap, report.sla_breached, report.manual) == (250, 1, 2, 1)
        assert report.webhook_failures == 0
        assert metric("order_alerts_total", alertname="IdemPendingStuck") - alerts_before == 250

        # One ERROR line per row, with what a person needs to find it.
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert sum("stuck pending t_idem row" in m for m in errors) == 250
        line = next(m for m in errors if keys["stuck"][0] in m)
        assert "step=issue_waybill attempts=1 owner=gone-1/main/x age=" in line
        assert sum("over the attempt cap" in m and keys["capped"][0] in m for m in errors) == 1
        assert sum("COMPENSATION_SLA_SECONDS" in m for m in errors) == 2

        # Alertmanager's webhook format: 250 stuck alerts in POSTs of at most 100, nothing truncated.
        stuck_posts = [p["body"] for p in receiver.posts if p["body"]["groupLabels"]["alertname"] == "IdemPendingStuck"]
        assert [len(p["alerts"]) for p in stuck_posts] == [100, 100, 50]
        body = stuck_posts[0]
        assert body["version"] == "4" and body["status"] == "firing" and body["truncatedAlerts"] == 0
        assert body["receiver"] == GROUP and body["externalURL"] == "http://desk:6066"
        assert body["commonLabels"] == {"alertname": "IdemPendingStuck", "severity": "warning",
                                        "step": "issue_waybill"}
        assert receiver.posts[0]["content_type"].startswith("application/json")
        first = body["alerts"][0]
        assert first["labels"]["biz_key"] == keys["stuck"][-1]                   # oldest first
        assert RFC3339.match(first["startsAt"]) and RFC3339.match(first["endsAt"])
        assert first["endsAt"] > first["startsAt"] and first["status"] == "firing"
        assert first["annotations"]["sweeper"] == "desk-1" and first["annotations"]["attempts"] == "1"
        assert first["generatorURL"].startswith("http://desk:6066/idem/ORD-")
        found = {a["labels"]["biz_key"] for a in receiver.alerts("IdemPendingStuck")}
        assert found == set(keys["stuck"])                                       # not the fresh, done or capped
        [capped] = receiver.alerts("IdemAttemptCapReached")
        assert capped["labels"] == {"alertname": "IdemAttemptCapReached", "severity": "warning",
                                    "biz_key": keys["capped"][0], "step": "send_sms"}
        breached = receiver.alerts("CompensationSlaBreached")
        overdue = ledger_ids(db, Status.OPEN)[:1] + ledger_ids(db, Status.RETRYING)
        assert sorted(int(a["labels"]["compensation_id"]) for a in breached) == sorted(overdue)
        [manual] = receiver.alerts("CompensationManualWaiting")
        assert int(manual["labels"]["compensation_id"]) == ledger_ids(db, Status.MANUAL)[0]
        assert manual["labels"]["severity"] == "info"

        # Pages: a limit stops the sweep early, oldest first; a receiver that fails is counted, not fatal.
        # More stuck rows than the limit (a mass outage) leave the dead letters their own room, and
        # the critical alerts go first (with the stuck rows first they were crowded out: none at all).
        receiver.status = 500
        limited = Sweep(Watch(MySqlStore(engine)), group=GROUP, stuck_after=600, attempt_cap=20, sla=1800,
                        limit=120, console_url="http://desk", webhook=webhook, letter_limit=2)
        report = await limited.run()
        assert report.stuck + report.over_cap == 120 and (report.sla_breached, report.manual) == (2, 0)
        assert [a.name for a in report.alerts[:2]] == ["CompensationSlaBreached"] * 2
        assert report.webhook_failures == 3                                     # the critical POST, two of stuck rows
        assert [a.labels["biz_key"] for a in report.alerts[2:5]] == keys["stuck"][::-1][:3]
    finally:
        await session.close()
        await engine.dispose()
        receiver.close()


async def test_the_stuck_query_walks_the_pending_index(settings, ops_db):
    explain = ops_db.query("EXPLAIN SELECT biz_key FROM t_idem WHERE status = 1 AND gmt_modified < NOW(3) - "
                           "INTERVAL 600 SECOND ORDER BY gmt_modified, biz_key LIMIT 200")
    assert explain[0]["key"] == "idx_status_modified", explain


async def test_the_queue_counts_stop_at_their_cap_and_say_so(settings, ops_db, monkeypatch):
    """GET /compensation/ counts with every list: a ledger of a million settled rows must not
    be read whole each time (the growth bench measured 72 ms for that scan)."""
    from app.adapters.mysql.reads import console as module
    db = ops_db
    db.query("DELETE FROM t_compensation")
    rows = [(Status.COMPENSATED, "effect_unavailable")] * 7 + [(Status.OPEN, "effect_unavailable")] * 4 \
        + [(Status.MANUAL, "payload_mismatch")] * 2
    for offset, (status, reason) in enumerate(rows):
        db.query("INSERT INTO t_compensation (src_topic, src_partition, src_offset, consumer_group, status, reason, "
                 "retriable, attempts, first_failure_at) VALUES ('order-event', 0, %s, %s, %s, %s, 1, 1, NOW(3))",
                 offset, GROUP, int(status), reason)
    monkeypatch.setattr(module, "COUNT_CAP", 5)
    engine = create_engine(settings, url=db.url)
    try:
        counts = await module.Queries(MySqlStore(engine), group=GROUP).counts()
    finally:
        await engine.dispose()
    assert counts["by_status"] == {"open": 4, "compensated": 5, "manual": 2}
    assert counts["capped"] == ["compensated", "by_reason_unsettled"] and counts["cap"] == 5
    assert sum(counts["by_reason_unsettled"].values()) == 6
    plans = db.query("EXPLAIN SELECT 1 FROM t_compensation WHERE status = 3 LIMIT 6")
    assert plans[0]["type"] == "ref" and plans[0]["key"].startswith("idx_status"), plans


@sql_modes.server_only      # its subject is two workers, not the SQL (tests/integration/test_sql_modes.py reads the gauges)
def test_workers_sweep_one_at_a_time_take_over_from_a_dead_sweeper_and_export_the_gauges(settings, topics,
                                                                                         spawn_worker, ops_db):
    """Two real workers with a 1 s sweep: the alerts come from one of them; SIGKILL it and the
    other takes over once the lease (2 sweeps) has run out. Both export the database's gauges,
    and an event of an order older than the retention is dead-lettered, never run."""
    ops_db.query("DELETE FROM t_idem")
    ops_db.query("DELETE FROM t_compensation")
    pair = topics(partitions=2, dlq_partitions=1)
    keys = plant(ops_db, stuck=3, prefix="SWEEPW")
    ops_db.query("UPDATE t_compensation SET consumer_group = %s WHERE consumer_group = %s", pair.group, GROUP)
    receiver = AlertReceiver()
    fakes = FakesProcess()
    env = {"MYSQL_URL": ops_db.url, "STUCK_SWEEP_SECONDS": "1", "METRICS_REFRESH_SECONDS": "1",
           "ALERT_WEBHOOK_URL": receiver.url, **fakes.env(),
           "BATCH_WITHIN_SECONDS": "0.3", "COMPENSATOR_WITHIN_SECONDS": "0.3"}
    try:
        workers = {name: spawn_worker(pair, name, **env) for name in ("a", "b")}
        ids = {w.env["WORKER_ID"]: name for name, w in workers.items()}

        def sweepers(since: int = 0) -> list[str]:
            return [ids[p["body"]["alerts"][0]["annotations"]["sweeper"]] for p in receiver.posts[since:]
                    if p["body"]["groupLabels"]["alertname"] == "IdemPendingStuck"]

        wait_for(lambda: len(sweepers()) >= 4, timeout=90, what="four sweeps", workers=list(workers.values()))
        assert len(set(sweepers())) == 1, sweepers()                       # one sweeper while it lives
        assert {a["labels"]["biz_key"] for a in receiver.alerts("IdemPendingStuck")} == set(keys["stuck"])
        first = sweepers()[0]
        workers[first].kill()
        workers[first].wait_exit(30)
        dead_at, mark = time.monotonic(), len(receiver.posts)
        other = "b" if first == "a" else "a"
        wait_for(lambda: other in sweepers(mark), timeout=60, what="the other worker sweeping",
                 workers=[workers[other]])
        took_over = time.monotonic() - dead_at
        assert took_over >= 0.5, took_over                     # the dead sweeper's lease had to run out first
        assert set(sweepers(mark)) == {other}
        print(f"the other worker took over the sweep {took_over:.1f}s after the sweeper died")

        # An order dated before the retention: dead-lettered as beyond_dedup_retention, never run.
        old_day = (datetime.now(UTC) - timedelta(days=120)).strftime("%Y%m%d")
        old, new = order_no(day=old_day, prefix="OLD"), order_no(prefix="NEW")
        asyncio.run(produce(settings, pair.events, [record(event(o, "ORDER_CREATED")) for o in (old, new)]))
        wait_for(lambda: ops_db.scalar("SELECT status FROM t_compensation WHERE order_no = %s", old) == Status.MANUAL
                 and ops_db.scalar("SELECT status FROM t_order WHERE order_no = %s", new) is not None,
                 timeout=60, what="the old order's dead letter, manual, and the new order created",
                 workers=[workers[other]])
        letter = ops_db.query("SELECT reason, retriable, message FROM t_compensation WHERE order_no = %s", old)[0]
        assert letter["reason"] == "beyond_dedup_retention" and not letter["retriable"]
        assert "IDEM_RETENTION_DAYS=90" in letter["message"]
        assert ops_db.scalar("SELECT COUNT(*) FROM t_idem WHERE biz_key LIKE %s", old + ":%") == 0
        assert ops_db.scalar("SELECT COUNT(*) FROM t_order WHERE order_no = %s", old) == 0
        assert ops_db.scalar("SELECT status FROM t_order WHERE order_no = %s", new) == 1

        # The gauges, as the surviving worker exports them.
        def scrape() -> str:
            port = workers[other].web_port
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()

        def value(text: str, sample: str) -> float | None:
            found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
            return None if found is None else float(found.group(1))

        wait_for(lambda: value(scrape(), 'order_compensation_rows{status="manual"}') == 2.0, timeout=30,
                 what="the manual gauge counting the old order's letter", workers=[workers[other]])
        text = scrape()
        assert value(text, 'order_idem_stuck_rows{step="issue_waybill"}') == 3
        assert value(text, 'order_idem_stuck_rows{step="send_sms"}') == 1
        assert value(text, "order_idem_over_attempt_cap_rows") == 1
        assert value(text, 'order_compensation_rows{status="open"}') == 2           # 2 h and 1 min old
        assert value(text, 'order_compensation_rows{status="retrying"}') == 1
        assert 7100 <= value(text, "order_compensation_oldest_open_age_seconds") < 7400
        assert 10800 <= value(text, "order_compensation_oldest_manual_age_seconds") < 11100
        assert value(text, "order_compensation_sla_seconds") == 1800
        assert value(text, "order_idem_stuck_threshold_seconds") == 600
        assert value(text, "order_idem_capacity_budget_rows") > 0
        assert 0 < value(text, "order_idem_capacity_watermark") < 1e-3
        assert value(text, "order_idem_partitions_ahead") >= 3
        assert value(text, "order_idem_writes_total") >= 1 and value(text, 'order_idem_claims_total{result="new"}') >= 1
        # Commits come every BROKER_COMMIT_INTERVAL_SECONDS: wait for one, do not assume it came.
        wait_for(lambda: (value(scrape(), "order_kafka_last_commit_timestamp_seconds") or 0) > time.time() - 120,
                 timeout=30, what="a commit of the surviving worker", workers=[workers[other]])

        def lag() -> list[float | None]:
            text = scrape()
            return [value(text, f'order_kafka_consumer_lag{{partition="{p}",topic="{pair.events}"}}') for p in (0, 1)]

        wait_for(lambda: lag() == [0, 0], timeout=30, what="no lag once everything is committed",
                 workers=[workers[other]])
        assert value(text, 'order_alerts_total{alertname="IdemPendingStuck"}') >= 3
        assert all(w.alive for name, w in workers.items() if name == other)
    finally:
        fakes.stop()
        receiver.close()


def test_the_budget_command_prints_the_model_for_the_given_rate_and_reads_the_table_with_current(ops_db):
    mode = {"DB_SQL_MODE": ops_db.sql_mode} if ops_db.sql_mode else {}

    def budget(*args: str, **env: str) -> str:
        out = subprocess.run([str(Path(sys.executable).with_name("faust")), "-A", "app", "budget", *args],
                             cwd=ROOT, env={**os.environ, "MYSQL_URL": ops_db.url, **mode, **env}, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout

    text = budget("--rate", "520", "--peak-rate", "1500", "--partitions", "48", "--workers", "16",
                  "--retention-days", "90")
    assert "keeping up at the peak (r = 94/s): W <= 376 events" in text      # 3 whole batches of 94 + 1 in flight
    assert "working off a backlog (r = 20,000/s):  W <= 11,000 events" in text
    assert "W = 0 (the batch in flight finishes and is committed)" in text
    assert f"rows:  {520 * 86_400 * 2:,} a day x (90 + 31) days = {520 * 86_400 * 2 * 121:,}" in text
    assert "needed: max(offsets retention 7 d, outage SLA 7 d, dead-letter window 30 d) x 2 = 60 days" in text
    assert "IDEM_RETENTION_DAYS=90: enough" in text
    assert "TOO SHORT" in budget("--retention-days", "30")
    ops_db.query("ANALYZE TABLE t_idem")
    rows = ops_db.scalar("SELECT SUM(TABLE_ROWS) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = %s "
                         "AND TABLE_NAME = 't_idem'", ops_db.name)
    current = budget("--current", IDEM_CAPACITY_BUDGET_ROWS="1000")
    assert "(IDEM_CAPACITY_BUDGET_ROWS)" in current
    assert re.search(rf"now: t_idem holds ~{int(rows):,} rows \(\d[\d,]* B per row as InnoDB reports it\); "
                     rf"watermark {int(rows) / 1000:.3f}", current), current[-400:]
