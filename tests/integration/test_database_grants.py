"""The database accounts of the deployment guide are enough, and what they say the workers need is what
the workers use: on a MariaDB of this module's own, the migration's account and the workers' account are
made with exactly the ``GRANT`` lines of ``docs/deploying.md`` (Database grants). The migration runs with
the first; a worker runs with the second through orders with their waybill and SMS calls, a dead letter
and its compensation, the reconcile timer, the sweeps, the gauges and the partition maintenance (a month
added, the months past the retention dropped); then the operators' commands. No statement is refused.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.console import served_worker
from harness.events import event, order_no, record
from harness.own_servers import MariaDB
from harness.services import ROOT, wait_for

GUIDE = ROOT / "docs" / "deploying.md"
DATABASE = "idem"
PASSWORD = "grants-" + uuid.uuid4().hex[:8]
REFUSED = re.compile(r"command denied|Access denied|\(1142|\(1143|\(1044|\(1227")
MIGRATOR, WORKER = "oep-migrate", "oep-worker"


def documented_grants() -> dict[str, list[str]]:
    """The guide's GRANT statements, by the account they name."""
    text = GUIDE.read_text()
    section = text[text.index("## Database grants"):]
    block = section[section.index("```sql"):section.index("```", section.index("```sql") + 6)]
    grants: dict[str, list[str]] = {}
    for line in block.splitlines():
        line = line.split("--", 1)[0].strip()
        found = re.fullmatch(r"GRANT (.+) TO '([^']+)'@'%';", line)
        if found:
            grants.setdefault(found.group(2), []).append(found.group(1))
    assert set(grants) == {MIGRATOR, WORKER}, f"the guide's accounts changed: {grants}"
    return grants


@dataclass
class Db:
    url: str


@pytest.fixture(scope="module")
def server(request):
    home = ROOT / ".cache" / "grants" / uuid.uuid4().hex[:8]
    home.mkdir(parents=True)
    db = MariaDB(home, name=f"grants-{home.name}")
    failed = request.session.testsfailed
    db.install()
    db.start()
    yield db
    db.stop()
    if request.session.testsfailed == failed:
        shutil.rmtree(home, ignore_errors=True)


def grant(db: MariaDB, user: str, statements: list[str], *, create: bool) -> None:
    with closing(db.root()) as conn, conn.cursor() as cur:
        if create:
            cur.execute(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY %s", (PASSWORD,))
        for what in statements:
            cur.execute(f"GRANT {what} TO '{user}'@'127.0.0.1'")


def partitions(db: MariaDB) -> list[str]:
    with closing(db.root()) as conn, conn.cursor() as cur:
        cur.execute("SELECT PARTITION_NAME FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = %s "
                    "AND TABLE_NAME = 't_idem' ORDER BY PARTITION_ORDINAL_POSITION", (DATABASE,))
        return [row[0] for row in cur.fetchall()]


def scalar(db: MariaDB, sql: str):
    with closing(db.root()) as conn, conn.cursor() as cur:
        cur.execute(f"USE {DATABASE}")
        cur.execute(sql)
        return cur.fetchone()[0]


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def test_the_documented_grants_run_the_migration_a_worker_and_the_commands(server, settings):
    grants = documented_grants()
    with closing(server.root()) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {DATABASE} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    table_level = [g for g in grants[WORKER] if f" ON {DATABASE}.*" not in g]
    grant(server, MIGRATOR, grants[MIGRATOR], create=True)
    grant(server, WORKER, [g for g in grants[WORKER] if g not in table_level], create=True)

    base = {k: v for k, v in os.environ.items() if not k.startswith(("MYSQL_", "DB_"))}
    migrated = run([sys.executable, "-m", "app.admin", "migrate"],
                   {**base, "MYSQL_URL": server.url(DATABASE, MIGRATOR, PASSWORD)})
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    # A grant on one table needs the table: the guide gives it after the first migration.
    grant(server, WORKER, table_level, create=False)
    worker_url = server.url(DATABASE, WORKER, PASSWORD)
    schema = run([sys.executable, "-m", "app.admin", "schema"], {**base, "MYSQL_URL": worker_url})
    assert schema.returncode == 0, schema.stdout + schema.stderr

    before = partitions(server)
    assert "p_before" in before and "p_future" in before
    created, cancelled, refused = (order_no(prefix="GRC"), order_no(prefix="GRX"), order_no(prefix="GRR"))
    docs = [event(created, t) for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
    docs += [event(cancelled, "ORDER_CREATED"), event(cancelled, "ORDER_CANCEL"),
             event(refused, "ORDER_CREATED"), event(refused, "ORDER_PAID"), event(refused, "ORDER_CONFIRM")]
    records = [record(d) for d in docs] + [(b"ORD-not-a-number", b'{"order_no": "ORD-not-a-number"}')]
    env = {"DB_SQL_MODE": "", "PARTITIONS_AHEAD": "5", "IDEM_RETENTION_DAYS": "200", "RECONCILE_EVERY_SECONDS": "1",
           "RECONCILE_LAG_SECONDS": "0", "STUCK_SWEEP_SECONDS": "1", "METRICS_REFRESH_SECONDS": "1",
           "STORE_WATERMARK_SECONDS": "1", "COMPENSATION_TIMER_SECONDS": "1", "DLQ_RETRY_AFTER_SECONDS": "0",
           "COMPENSATION_BACKOFF_SECONDS": "1", "RETRY_BACKOFF_MS": "20,20,20"}
    # The logistics API answers 503 to the first calls, past the batch's retries: dead letters the
    # compensator then redrives to their end, as the workers' account.
    faults = {"waybill": {"fail_next": 8, "fail_status": 503}}
    with served_worker(settings, Db(worker_url), "grants", records, fakes=faults, **env) as served:
        worker = served.worker

        seen: dict = {}

        def settled():
            refusals = [line for line in worker.logs().splitlines() if REFUSED.search(line)]
            assert refusals == [], f"the workers' account was refused: {refusals[:3]}"
            seen.update(done=scalar(server, "SELECT COUNT(*) FROM t_idem WHERE status = 2"),
                        compensated=scalar(server, "SELECT COUNT(*) FROM t_compensation WHERE status = 3"),
                        manual=scalar(server, "SELECT COUNT(*) FROM t_compensation WHERE status = 4"),
                        runs=scalar(server, "SELECT COUNT(*) FROM t_reconcile_run WHERE finished_at IS NOT NULL"),
                        partitions=partitions(server))
            return (seen["done"] == 11 and seen["compensated"] >= 1 and seen["manual"] == 1 and seen["runs"] >= 1
                    and "p_before" not in seen["partitions"])

        try:
            wait_for(settled, timeout=120, what="orders done, dead letters settled, a reconcile run, the partitions "
                                                "kept", workers=[worker])
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last seen {seen}; log {worker.log_path}") from None
        after = partitions(server)
        assert after[-1] == "p_future" and len([p for p in after if p not in before]) >= 2, (before, after)
        cli = {**worker.env}
        for args in (["dlq", "list", "--limit", "5"], ["recovery", "start", "--hours", "1", "--note", "grants"],
                     ["recovery", "status"], ["recovery", "end", "--note", "grants"],
                     ["reconcile", "--last", "10m", "--no-store", "--json"], ["budget", "--current"]):
            done = run([str(Path(sys.executable).with_name("faust")), "-A", "app", *args], cli)
            assert done.returncode in (0, 1), (args, done.stdout[-2000:], done.stderr[-2000:])
            assert not REFUSED.search(done.stdout + done.stderr), (args, done.stderr[-2000:])
        logs = worker.logs()
    refusals = [line for line in logs.splitlines() if REFUSED.search(line)]
    assert refusals == [], f"the workers' account was refused: {refusals[:5]}"
    assert "t_idem partitions: dropped" in logs and "t_idem partitions: added" in logs
