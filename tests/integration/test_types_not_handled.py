"""Types not handled, as real clients write them (kcat with its headers, Kafka's Java client, aiokafka)
to a real worker, Kafka and MariaDB: a handled type in disguise (case, a trailing space, other
separators, a rename) is a dead letter that names the type it resembles, never skipped; another team's
type is skipped and reaches a person as a new type until it is declared; a relay's CloudEvents headers
on a native body are a dead letter, not a skipped CONFIRM, and a retry once the envelope is set runs
it; the reconcile lists the skipped types by count."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from harness.console import call
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.java import java_produce, utf8
from harness.services import ROOT, caught_up, produce, wait_for, worker_metric

FAUST = Path(sys.executable).parent / "faust"
TOKEN = "s3cret-token-for-types-not-handled"
CONFIRMED = 3


def kcat_produce(bootstrap: str, topic: str, key: str, value: dict, headers: dict[str, str] | None = None) -> None:
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    assert kcat, "kcat is needed (make test-tools installs Debian's kcat)"
    args = [kcat, "-P", "-b", bootstrap, "-t", topic, "-K", "\t"]
    for name, text in (headers or {}).items():
        args += ["-H", f"{name}={text}"]
    subprocess.run(args, input=f"{key}\t{json.dumps(value)}\n".encode(), check=True, timeout=60)


def letters(db, topic: str) -> list[dict]:
    return db.query("SELECT id, src_offset, reason, message, status FROM t_compensation WHERE src_topic = %s "
                    "ORDER BY src_offset", topic)


def reconcile(worker, began: datetime, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(FAUST), "-A", "app", "reconcile", "--from", (began - timedelta(minutes=1)).isoformat(),
                           "--to", (datetime.now(UTC) + timedelta(minutes=1)).isoformat(), *more],
                          cwd=ROOT, capture_output=True, text=True, env=worker.env, timeout=180)


def test_disguised_types_are_dead_letters_and_foreign_ones_reach_a_person(settings, topics, spawn_worker, own_db):
    pair = topics(partitions=1)
    fakes = FakesProcess()
    try:
        began = datetime.now(UTC)
        good, relayed, paid = (order_no(prefix=p) for p in ("TNHG", "TNHR", "TNHP"))
        asyncio.run(produce(settings, pair.events, [
            *(record(event(good, t)) for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")),
            *(record(event(relayed, t)) for t in ("ORDER_CREATED", "ORDER_PAID")),
            record(event(paid, "ORDER_CREATED"))]))
        bootstrap = settings.kafka.bootstrap
        # A relay that adds CloudEvents headers to a native CONFIRM, naming it its own way.
        confirm = event(relayed, "ORDER_CONFIRM")
        kcat_produce(bootstrap, pair.events, relayed, confirm, {
            "ce_specversion": "1.0", "ce_id": confirm["event_id"], "ce_source": "/relay",
            "ce_type": "com.shop.order.confirm", "ce_subject": relayed, "ce_time": confirm["occurred_at"]})
        # A PAID written four ways it is not, by kcat and by Kafka's Java client; a rename; another team's type.
        for disguise in ("order_paid", "ORDER_PAID "):
            kcat_produce(bootstrap, pair.events, paid, event(paid, "ORDER_PAID", type=disguise))
        java = [event(paid, "ORDER_PAID", type="Order-Paid"), event(paid, "ORDER_PAID", type="ORDER.PAID"),
                event(paid, "ORDER_CONFIRM", type="ORDER_CONFIRMED"),
                event(good, "ORDER_CONFIRM", type="ORDER_SHIPPED"), event(good, "ORDER_CONFIRM", type="ORDER_SHIPPED")]
        java_produce(bootstrap, pair.events, [{"partition": 0, "key": utf8(doc["order_no"]),
                                                "value": utf8(json.dumps(doc))} for doc in java])
        worker = spawn_worker(pair, "a", **fakes.env(), MYSQL_URL=own_db.url, RECONCILE_EVERY_SECONDS="0",
                              METRICS_REFRESH_SECONDS="0.5", WEB_TOKEN=TOKEN)

        wait_for(lambda: caught_up(settings, pair.events, pair.group, 1), timeout=120, what="every record committed",
                 workers=[worker])
        got = letters(own_db, pair.events)
        assert [(r["src_offset"], r["reason"], r["status"]) for r in got] == [
            (6, "ambiguous_type", 4), (7, "lookalike_type", 4), (8, "lookalike_type", 4), (9, "lookalike_type", 4),
            (10, "lookalike_type", 4), (11, "lookalike_type", 4)], got
        messages = [r["message"] for r in got]
        assert ("'com.shop.order.confirm' (read from ce:type) is a type this processor does not handle, but its "
                "body's own type 'ORDER_CONFIRM' is ORDER_CONFIRM") in messages[0]
        for message, disguise in zip(messages[1:5], ("order_paid", "ORDER_PAID ", "Order-Paid", "ORDER.PAID"),
                                     strict=True):
            assert f"event type {disguise!r} is not one this processor handles, but it is ORDER_PAID but for " \
                   "case, spaces or separators" in message
        assert "'ORDER_CONFIRMED' is not one this processor handles, but it contains ORDER_CONFIRM" in messages[5]
        assert {o: len(fakes.ledger()["waybills"].get(o, ())) for o in (good, relayed)} == {good: 1, relayed: 0}

        # ORDER_SHIPPED is skipped, and as a type never skipped before it is new: the alert's gauge moves.
        wait_for(lambda: worker_metric(worker, "order_skipped_types_new") == 1.0, timeout=30,
                 what="the new skipped type counted", workers=[worker])
        assert worker_metric(worker, "order_skipped_types") == 1.0
        assert worker_metric(worker, "order_events_skipped_total", '{type="other"}') == 2.0
        assert worker_metric(worker, "order_events_skipped_total", '{type="ORDER_SHIPPED"}') is None
        assert worker_metric(worker, "order_dead_letters_total", '{reason="lookalike_type"}') == 5.0
        assert worker_metric(worker, "order_dead_letters_total", '{reason="ambiguous_type"}') == 1.0

        done = reconcile(worker, began, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(done.stdout)
        assert {k: v for k, v in report["ends"].items() if v} == {"done": 6, "dead_letter": 6, "skipped": 2}
        assert report["skipped_types"] == [{"type": "ORDER_SHIPPED", "records": 2, "declared": False}]
        text = reconcile(worker, began)
        assert "skipped by type: 2 'ORDER_SHIPPED' (not in FOREIGN_EVENT_TYPES)" in text.stdout, text.stdout
        print(text.stdout)

        # Declared another team's: no longer new, and a series of its own. Read as native, the relayed
        # CONFIRM's letter runs when a person retries it: nothing was lost.
        worker.stop()
        worker = spawn_worker(pair, "b", **fakes.env(), MYSQL_URL=own_db.url, RECONCILE_EVERY_SECONDS="0",
                              METRICS_REFRESH_SECONDS="0.5", WEB_TOKEN=TOKEN, FOREIGN_EVENT_TYPES="ORDER_SHIPPED",
                              EVENT_ENVELOPE="native")
        wait_for(lambda: worker_metric(worker, "order_skipped_types") == 1.0, timeout=60,
                 what="the gauges refreshed", workers=[worker])
        assert worker_metric(worker, "order_skipped_types_new") == 0.0          # declared: no longer new
        java_produce(bootstrap, pair.events, [{"partition": 0, "key": utf8(good), "value": utf8(json.dumps(
            event(good, "ORDER_CONFIRM", type="ORDER_SHIPPED")))}])
        wait_for(lambda: worker_metric(worker, "order_events_skipped_total", '{type="ORDER_SHIPPED"}') == 1.0,
                 timeout=60, what="the declared type counted by name", workers=[worker])
        base = f"http://127.0.0.1:{worker.web_port}"
        status, answer = call("POST", f"{base}/compensation/{got[0]['id']}/retry", token=TOKEN,
                              body=json.dumps({"note": "relay headers: EVENT_ENVELOPE=native", "actor": "t"}).encode())
        assert status == 200, answer
        assert {o: len(fakes.ledger()["waybills"].get(o, ())) for o in (good, relayed)} == {good: 1, relayed: 1}
        assert own_db.scalar("SELECT status FROM t_order WHERE order_no = %s", relayed) == CONFIRMED
    finally:
        fakes.stop()
