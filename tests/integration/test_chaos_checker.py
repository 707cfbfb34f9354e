"""The chaos checker (harness/chaos/checker.py) without the chaos driver: a small run of one
real worker that it must pass, then the run's evidence tampered with, one way at a time,
each of which it must report as the violation it is.

The run: a few orders with every ending the rules allow (confirmed, cancelled, stopped at
CREATED or PAID), an exact duplicate and re-published copies, two late events (a PAID after
the CONFIRM, produced once the CONFIRM is dead-lettered, which is then compensated; a PAID after
the CANCEL: stale) and four malformed records (one of a type not handled: skipped), on fresh topics; the worker runs until the group has committed every
offset and the compensator has settled every dead letter, then is stopped. The manifest is
written here, as the driver would write it.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.topics import topic_specs
from app.settings import Settings
from harness.chaos.checker import check
from harness.chaos.driver import declared_effect_steps
from harness.chaos.report import render, write_json
from harness.events import event, order_no
from harness.fakes import FakesProcess
from harness.services import (
    ROOT,
    ScratchDatabase,
    Worker,
    caught_up,
    create_topics,
    delete_topics,
    free_port,
    wait_for,
    worker_env,
)

FAST = {"RETRY_BACKOFF_MS": "20,20,20", "BATCH_WITHIN_SECONDS": "0.3", "DLQ_RETRY_AFTER_SECONDS": "1",
        "COMPENSATION_BACKOFF_SECONDS": "1", "COMPENSATION_TIMER_SECONDS": "0.5", "COMPENSATOR_WITHIN_SECONDS": "0.3",
        "SMS_LOOKUP_SETTLE_SECONDS": "2"}
PARTITIONS = 2
LIFECYCLES = {"confirmed": ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM"),
              "cancelled": ("ORDER_CREATED", "ORDER_PAID", "ORDER_CANCEL"),
              "paid": ("ORDER_CREATED", "ORDER_PAID"), "created": ("ORDER_CREATED",),
              "paid_late": ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM"),       # PAID after the CONFIRM
              "stale_paid": ("ORDER_CREATED", "ORDER_PAID", "ORDER_CANCEL")}       # PAID after the CANCEL


@dataclass
class Run:
    manifest: dict
    path: Path
    db: ScratchDatabase
    fakes: FakesProcess
    orders: dict          # role -> order number
    settings: Settings

    def check(self, manifest: dict | None = None):
        if manifest is not None:
            self.path.write_text(json.dumps(manifest))
        try:
            return check(self.path)
        finally:
            self.path.write_text(json.dumps(self.manifest))

    def entry(self, role: str, type_: str, kind: str = "original") -> dict:
        return next(e for e in self.manifest["produced"]
                    if e["order_no"] == self.orders[role] and e["type"] == type_ and e["kind"] == kind)

    def malformed(self, label: str) -> dict:
        return next(e for e in self.manifest["produced"] if e["malformed_kind"] == label)


def plan() -> tuple[dict, list[tuple[dict, tuple]]]:
    """The orders, and every record in the order produced: (manifest fields, (key, value))."""
    orders = {role: order_no(prefix="CHK") for role in LIFECYCLES}
    docs = {role: {t: event(orders[role], t) for t in lifecycle} for role, lifecycle in LIFECYCLES.items()}
    out: list[tuple[dict, tuple]] = []

    def emit(doc: dict, kind: str = "original", duplicate_of: str | None = None, late: bool = False) -> None:
        out.append(({"kind": kind, "event_id": doc["event_id"], "order_no": doc["order_no"], "type": doc["type"],
                     "duplicate_of": duplicate_of, "late": late, "malformed_kind": None},
                    (doc["order_no"].encode(), json.dumps(doc).encode())))

    def malformed(label: str, key: bytes | None, value: bytes | None) -> None:
        out.append(({"kind": "malformed", "event_id": None, "order_no": None, "type": None, "duplicate_of": None,
                     "late": False, "malformed_kind": label}, (key, value)))

    for role in ("confirmed", "cancelled", "paid", "created"):
        for doc in docs[role].values():
            emit(doc)
    late, stale = docs["paid_late"], docs["stale_paid"]
    for doc in (late["ORDER_CREATED"], late["ORDER_CONFIRM"], stale["ORDER_CREATED"], stale["ORDER_CANCEL"]):
        emit(doc)
    emit(late["ORDER_PAID"], late=True)       # after its CONFIRM: the CONFIRM waits in the ledger
    emit(stale["ORDER_PAID"], late=True)      # after its CANCEL: stale
    confirm = docs["confirmed"]["ORDER_CONFIRM"]
    emit(confirm, "exact_duplicate", duplicate_of=confirm["event_id"])
    for doc in (docs["confirmed"]["ORDER_PAID"], docs["cancelled"]["ORDER_CANCEL"], stale["ORDER_PAID"]):
        emit({**doc, "event_id": str(uuid.uuid4())}, "republished", duplicate_of=doc["event_id"],
             late=doc is stale["ORDER_PAID"])
    bad = order_no(prefix="CHKBAD").encode()
    malformed("not_json", bad, b'{"event_id": "x", "order_no": ')
    malformed("no_order_no", bad, json.dumps({k: v for k, v in event(bad.decode(), "ORDER_CREATED").items()
                                              if k != "order_no"}).encode())
    malformed("bad_type", bad, json.dumps(event(bad.decode(), "ORDER_CREATED", type="ORDER_TELEPORTED")).encode())
    malformed("tombstone", bad, None)
    lifecycles = {orders[role]: list(lifecycle) for role, lifecycle in LIFECYCLES.items()}
    return {"orders": orders, "lifecycles": lifecycles}, out


def scrape(worker: Worker) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode()

    def samples(name: str) -> dict:
        return {label: int(float(v)) for label, v in re.findall(rf'^{name}\{{\w+="([^"]*)"\}} (\S+)$', text, re.M)}

    replayed = re.search(r"^order_events_replayed_total (\S+)$", text, re.M)
    claims = samples("order_idem_claims_total")
    return {"replayed": int(float(replayed.group(1))) if replayed else 0, "claims": claims,
            "claims_done": claims.get("done", 0), "dead_letters": samples("order_dead_letters_total")}


@pytest.fixture(scope="module")
def run(settings: Settings, scratch_db: ScratchDatabase, tmp_path_factory):
    suffix = uuid.uuid4().hex[:8]
    events, dlq, group = f"test-chk-event-{suffix}", f"test-chk-dlq-{suffix}", f"test-chk-group-{suffix}"
    specs = topic_specs(settings.model_copy(update={"order_event_partitions": PARTITIONS, "dlq_partitions": 1}),
                        events=events, dlq=dlq)
    asyncio.run(create_topics(settings, specs))
    fakes = FakesProcess({"waybill": {"latency_ms": 5}, "sms": {"latency_ms": 5}})
    worker = None
    try:
        started_at = time.time()
        shape, records = plan()
        # The late PAID and what follows it go once its CONFIRM is in the ledger: in the same batch, the
        # CONFIRM would give way to it and apply then, with no dead letter.
        cut = next(i for i, (fields, _) in enumerate(records)
                   if fields["late"] and fields["order_no"] == shape["orders"]["paid_late"])
        placed = asyncio.run(kafka_ops.produce(settings.kafka.bootstrap, events, [r for _, r in records[:cut]]))
        env = worker_env(MYSQL_URL=scratch_db.url, WORKER_ID=f"chk-{suffix}", ORDER_EVENT_TOPIC=events, DLQ_TOPIC=dlq,
                         APP_ID=group, ORDER_EVENT_PARTITIONS=str(PARTITIONS), DLQ_PARTITIONS="1",
                         **fakes.env(), **FAST)
        worker = Worker(env, f"chaos-checker-{suffix}").start()
        worker_started = time.time()
        wait_for(lambda: scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE consumer_group = %s AND "
                                           "order_no = %s", group, shape["orders"]["paid_late"]) == 1,
                 timeout=90, what="the CONFIRM before its PAID dead-lettered", workers=[worker])
        placed += asyncio.run(kafka_ops.produce(settings.kafka.bootstrap, events, [r for _, r in records[cut:]]))
        marks = ", ".join(["%s"] * len(shape["lifecycles"]))

        def settled() -> bool:
            unsettled = scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE consumer_group = %s AND "
                                          "status IN (1, 2)", group)
            letters = scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE consumer_group = %s", group)
            pending = scratch_db.scalar(f"SELECT COUNT(*) FROM t_idem WHERE status = 1 AND SUBSTRING_INDEX(biz_key, "
                                        f"':', 1) IN ({marks})", *shape["lifecycles"])
            return letters >= 4 and unsettled == 0 and pending == 0 and \
                caught_up(settings, events, group, PARTITIONS)

        wait_for(settled, timeout=90, what="every record committed and every dead letter settled", workers=[worker])
        metrics = scrape(worker)
        code = worker.stop()
        drained_at = time.time()
        parts = urlsplit(scratch_db.url)
        manifest = {
            "seed": 0, "mode": "short", "started_at": started_at, "storm_ended_at": drained_at,
            "drained_at": drained_at, "bootstrap": settings.kafka.bootstrap,
            "mysql": {"host": parts.hostname, "port": parts.port or 3306, "user": parts.username,
                      "password": parts.password or "", "database": parts.path.lstrip("/")},
            "events_topic": events, "dlq_topic": dlq, "group": group, "partitions": PARTITIONS,
            "fakes_url": fakes.url, "sms_lookup": True,
            "produced": [{"partition": p, "offset": o, **fields} for (fields, _), (p, o) in zip(records, placed)],
            "orders": {o: {"lifecycle": lc} for o, lc in shape["lifecycles"].items()},
            "workers": [{"id": env["WORKER_ID"], "pid": worker.proc.pid, "started_at": worker_started,
                         "ended_at": drained_at, "returncode": code, "killed_by_test": False,
                         "stopped_by_test": True, "log": worker.log_path.name}],
            "faults": [], "metrics": metrics,
            "drain": {"seconds": round(drained_at - worker_started, 1), "settled": True, "open_left": 0},
            "effect_steps": declared_effect_steps(),
        }
        path = tmp_path_factory.mktemp("chaos-checker") / "manifest.json"
        path.write_text(json.dumps(manifest))
        yield Run(manifest, path, scratch_db, fakes, shape["orders"], settings)
    finally:
        if worker is not None and worker.alive:
            worker.kill()
            worker.wait_exit(30)
        fakes.stop()
        asyncio.run(delete_topics(settings, [events, dlq]))


def test_the_checker_imports_nothing_of_the_pipeline():
    code = ("import sys, harness.chaos.checker, harness.chaos.report; "
            "print(sorted(m for m in sys.modules if m == 'app' or m.startswith('app.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_clean_run_is_ok(run: Run, tmp_path):
    report = run.check()
    assert report.ok, render(report)
    assert report.problems == []
    assert (report.events, report.originals, report.exact_duplicates, report.republished, report.malformed) == \
        (23, 15, 1, 3, 4)
    assert report.accounted["dead_letter"] == {"precondition_not_met": 1, "not_json": 1, "missing_field:order_no": 1,
                                               "empty_value": 1}
    assert report.accounted["skipped"] == 1                  # the type not handled
    # The stale PAID and its re-published copy; every other valid record done.
    assert (report.accounted["done"], report.accounted["stale"]) == (16, 2)
    # Late: the PAID after the CONFIRM applied (its CONFIRM waited in the ledger), the PAID after
    # the CANCEL and its copy stale.
    assert report.late_outcomes == {"done": 1, "stale": 2}
    assert (report.compensated, report.manual) == (1, 3)
    assert report.manual_by_reason == {"not_json": 1, "missing_field:order_no": 1, "empty_value": 1}
    assert (report.effects["waybills"], report.effects["receipts"], report.effects["sms"]) == (2, 2, 2)
    assert report.duplicates_stopped == 4
    table = render(report)
    assert "| verdict | ok |" in table and "| lost | 0 |" in table
    write_json(report, tmp_path / "report.json")
    assert json.loads((tmp_path / "report.json").read_text())["ok"] is True


# -- tampering: each must be reported as the violation it is ------------------------------------

def _one(run: Run, sql: str, *args) -> dict:
    [row] = run.db.query(sql, *args)
    return row


def _insert(run: Run, table: str, row: dict) -> None:
    run.db.query(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(['%s'] * len(row))})", *row.values())


def _ledger_row(run: Run, entry: dict) -> dict:
    return _one(run, "SELECT * FROM t_compensation WHERE consumer_group = %s AND src_topic = %s AND "
                     "src_partition = %s AND src_offset = %s", run.manifest["group"], run.manifest["events_topic"],
                entry["partition"], entry["offset"])


def backwards(run: Run):
    """A confirmed order moved back to PAID."""
    o = run.orders["confirmed"]
    run.db.query("UPDATE t_order SET status = 2 WHERE order_no = %s", o)
    return "regressions", o, lambda: run.db.query("UPDATE t_order SET status = 3 WHERE order_no = %s", o)


def stale_read_as_applied(run: Run):
    """The PAID that came after the CANCEL recorded as applied: the rules say stale."""
    key = f"{run.orders['stale_paid']}:ORDER_PAID:mark_paid"
    run.db.query("UPDATE t_idem SET outcome = 'applied' WHERE biz_key = %s", key)
    return "regressions", run.orders["stale_paid"], \
        lambda: run.db.query("UPDATE t_idem SET outcome = 'stale' WHERE biz_key = %s", key)


def idem_row_deleted(run: Run):
    """The PAID of the confirmed order forgotten by t_idem: its original and its copy are lost."""
    key = f"{run.orders['confirmed']}:ORDER_PAID:mark_paid"
    row = _one(run, "SELECT * FROM t_idem WHERE biz_key = %s", key)
    run.db.query("DELETE FROM t_idem WHERE biz_key = %s", key)
    return "lost", run.orders["confirmed"], lambda: _insert(run, "t_idem", row)


def pending_left(run: Run):
    key = f"{run.orders['cancelled']}:ORDER_CANCEL:send_cancel_sms"
    run.db.query("UPDATE t_idem SET status = 1 WHERE biz_key = %s", key)
    return "pending_left", key, lambda: run.db.query("UPDATE t_idem SET status = 2 WHERE biz_key = %s", key)


def ledger_row_twice(run: Run):
    """A second ledger row for the dead-lettered CONFIRM (another source timestamp)."""
    row = _ledger_row(run, run.entry("paid_late", "ORDER_CONFIRM"))
    copy = {k: v for k, v in row.items() if k != "id"}
    copy["src_timestamp"] += 1
    _insert(run, "t_compensation", copy)
    return "double_accounted", run.orders["paid_late"], lambda: run.db.query(
        "DELETE FROM t_compensation WHERE id > %s AND src_offset = %s AND src_timestamp = %s", row["id"],
        row["src_offset"], copy["src_timestamp"])


def malformed_not_dead_lettered(run: Run):
    entry = run.malformed("not_json")
    row = _ledger_row(run, entry)
    run.db.query("DELETE FROM t_compensation WHERE id = %s", row["id"])
    return "lost", f"[{entry['partition']}]@{entry['offset']}", lambda: _insert(run, "t_compensation", row)


def malformed_with_another_reason(run: Run):
    row = _ledger_row(run, run.malformed("no_order_no"))
    run.db.query("UPDATE t_compensation SET reason = 'precondition_not_met' WHERE id = %s", row["id"])
    return "misaccounted", "no_order_no", lambda: run.db.query(
        "UPDATE t_compensation SET reason = %s WHERE id = %s", row["reason"], row["id"])


def dead_letter_reopened(run: Run):
    row = _ledger_row(run, run.entry("paid_late", "ORDER_CONFIRM"))
    run.db.query("UPDATE t_compensation SET status = 1 WHERE id = %s", row["id"])
    return "unsettled", run.orders["paid_late"], lambda: run.db.query(
        "UPDATE t_compensation SET status = %s WHERE id = %s", row["status"], row["id"])


def receipt_without_waybill(run: Run):
    """A receipt for an order that was never confirmed."""
    o = run.orders["paid"]
    _insert(run, "t_waybill_receipt", {"order_no": o, "waybill_no": "WB-NONE", "idem_token": "t",
                                       "biz_key": f"{o}:ORDER_CONFIRM:issue_waybill", "attempt": 1})
    return "duplicate_effects", o, lambda: run.db.query("DELETE FROM t_waybill_receipt WHERE order_no = %s", o)


def receipt_of_another_waybill(run: Run):
    o = run.orders["confirmed"]
    was = _one(run, "SELECT waybill_no FROM t_waybill_receipt WHERE order_no = %s", o)["waybill_no"]
    run.db.query("UPDATE t_waybill_receipt SET waybill_no = 'WB-OTHER' WHERE order_no = %s", o)
    return "missing_effects", o, lambda: run.db.query(
        "UPDATE t_waybill_receipt SET waybill_no = %s WHERE order_no = %s", was, o)


def record_that_never_was(run: Run):
    """The manifest claims a record past the end of its partition."""
    o = order_no(prefix="CHKGHOST")
    # A partition the run wrote to (which ones depends on the orders' random numbers).
    partition = run.manifest["produced"][0]["partition"]
    end = max(e["offset"] for e in run.manifest["produced"] if e["partition"] == partition) + 1
    manifest = json.loads(json.dumps(run.manifest))
    manifest["produced"].append({"partition": partition, "offset": end, "kind": "original", "event_id": str(uuid.uuid4()),
                                 "order_no": o, "type": "ORDER_CREATED", "duplicate_of": None, "late": False,
                                 "malformed_kind": None})
    manifest["orders"][o] = {"lifecycle": ["ORDER_CREATED"]}
    return "lost", o, manifest


def worker_died(run: Run):
    manifest = json.loads(json.dumps(run.manifest))
    manifest["workers"].append({**manifest["workers"][0], "id": "w-died", "pid": 1, "returncode": 70,
                                "stopped_by_test": False})
    return "unexpected_exits", "w-died", manifest


def sources_out_of_reach(run: Run):
    """A ledger the checker cannot read is no evidence of a clean run."""
    manifest = json.loads(json.dumps(run.manifest))
    manifest["fakes_url"] = f"http://127.0.0.1:{free_port()}"
    return "unreadable", manifest["fakes_url"], manifest


def an_effect_it_has_no_check_for(run: Run):
    """A third effect declared (a push notification on CANCEL) that the checker was never taught:
    everything else is clean, and the run still fails."""
    manifest = json.loads(json.dumps(run.manifest))
    manifest["effect_steps"].append({"event_type": "ORDER_CANCEL", "step": "send_cancel_push", "effect": "push"})
    return "unchecked_effects", "'push'", manifest


def a_replay_past_the_key_horizon(run: Run):
    """The confirmed order's waybill key sent again (the API answers with the same waybill: no second
    one), held to a provider that keeps keys a millisecond: to such a provider it was a new request."""
    o = run.orders["confirmed"]
    token = _one(run, "SELECT idem_token FROM t_idem WHERE biz_key = %s", f"{o}:ORDER_CONFIRM:issue_waybill")["idem_token"]
    request = urllib.request.Request(f"{run.fakes.url}/v1/waybills", method="POST",
                                     data=json.dumps({"order_no": o, "address": "1 Test Road"}).encode(),
                                     headers={"Content-Type": "application/json", "Idempotency-Key": token})
    assert urllib.request.urlopen(request, timeout=10).status == 200          # replayed
    manifest = json.loads(json.dumps(run.manifest))
    for declared in manifest["effect_steps"]:
        if declared["effect"] == "waybill":
            assert declared["keys_kept_for_seconds"] == 86400                  # the provider's own, untampered
            declared["keys_kept_for_seconds"] = 0.001
    return "replayed_past_horizon", o, manifest


TAMPERS = [backwards, stale_read_as_applied, idem_row_deleted, pending_left, ledger_row_twice,
           malformed_not_dead_lettered, malformed_with_another_reason, dead_letter_reopened, receipt_without_waybill,
           receipt_of_another_waybill, record_that_never_was, worker_died, sources_out_of_reach,
           an_effect_it_has_no_check_for, a_replay_past_the_key_horizon]


@pytest.mark.parametrize("tamper", TAMPERS, ids=[t.__name__ for t in TAMPERS])
def test_a_tampered_run_is_reported(run: Run, tamper):
    violation, names, undo = tamper(run)
    try:
        report = run.check(undo if isinstance(undo, dict) else None)
    finally:
        if callable(undo):
            undo()
    assert not report.ok
    assert getattr(report, violation) >= 1, render(report)
    assert any(line.startswith(violation) and names in line for line in report.problems), report.problems


def test_a_step_left_to_a_person_past_its_key_horizon_is_not_pending_left(run: Run):
    """What a redrive past the provider's key horizon leaves: the step pending (a person may adopt the
    waybill the provider issued), no receipt, its dead letter manual for key_horizon_passed."""
    o = run.orders["paid_late"]
    key = f"{o}:ORDER_CONFIRM:issue_waybill"
    step = _one(run, "SELECT status, outcome FROM t_idem WHERE biz_key = %s", key)
    receipt = _one(run, "SELECT * FROM t_waybill_receipt WHERE order_no = %s", o)
    letter = _ledger_row(run, run.entry("paid_late", "ORDER_CONFIRM"))
    run.db.query("UPDATE t_idem SET status = 1, outcome = 'key_horizon_passed' WHERE biz_key = %s", key)
    run.db.query("DELETE FROM t_waybill_receipt WHERE order_no = %s", o)
    run.db.query("UPDATE t_compensation SET status = 4, reason = 'key_horizon_passed' WHERE id = %s", letter["id"])
    try:
        report = run.check()
    finally:
        run.db.query("UPDATE t_idem SET status = %s, outcome = %s WHERE biz_key = %s", step["status"],
                     step["outcome"], key)
        _insert(run, "t_waybill_receipt", receipt)
        run.db.query("UPDATE t_compensation SET status = %s, reason = %s WHERE id = %s", letter["status"],
                     letter["reason"], letter["id"])
    assert report.pending_left == 0 and report.effects["past_horizon_manual"] == 1, render(report)
    assert not [line for line in report.problems if o in line], report.problems


def test_effects_the_pipeline_never_made_and_a_record_nobody_read(run: Run):
    """Last, since they cannot be undone: a second waybill and a second SMS the services really
    made (called directly, as a pipeline that lost its token would), and a record written after
    the worker stopped."""
    confirmed, cancelled = run.orders["confirmed"], run.orders["cancelled"]

    def post(path: str, body: dict, headers: dict) -> None:
        request = urllib.request.Request(f"{run.fakes.url}{path}", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json", **headers})
        urllib.request.urlopen(request, timeout=10).read()

    post("/v1/waybills", {"order_no": confirmed, "address": "1 Test Road"}, {"Idempotency-Key": "another-token"})
    post("/v1/sms", {"phone": "+8613800000000", "text": f"Order {cancelled} was cancelled: again"}, {})
    asyncio.run(kafka_ops.produce(run.settings.kafka.bootstrap, run.manifest["events_topic"],
                                  [(confirmed.encode(), json.dumps(event(confirmed, "ORDER_CANCEL")).encode())]))
    report = run.check()
    assert not report.ok
    assert report.duplicate_effects == 2, render(report)
    assert {o for o in (confirmed, cancelled) if any(line.startswith("duplicate_effects") and o in line
                                                     for line in report.problems)} == {confirmed, cancelled}
    assert report.offsets_behind == 1 and report.manifest_mismatches == 1, render(report)

