"""SIGKILL a real worker at each cut point of the three transactions, restart it, and check
the invariants: one waybill per confirmed order (the fake's ledger), its
receipt, ``t_idem`` done, the order confirmed; an SMS never sent twice. Each cut is
run against providers of every contract: the logistics API that replays a repeated key
with the SMS gateway that answers lookups, then the express courier that refuses a
repeated reference (signed, enveloped) with an SMS gateway without lookup (``none``).

    before_a   inside T1, before COMMIT     nothing persisted
    a_b        after T1, before any call    rows pending, leases running
    b_c        after the calls, before T3   the services acted, no receipt
    after_c    after T3, before the ack     everything done, offsets not committed
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter

import pytest

from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import LOGS, caught_up, produce, wait_for

CONFIRMED, CANCELLED = 20, 10
# Short leases and session timeout: the restarted worker takes over in seconds. A 3 s
# lease covers the two batches of 100 in flight with 256 calls at a time (a lookup and a send
# of 1 s each, plus 0.5 s of margin), and the compensator's 210 calls in flight likewise.
CHAOS_ENV = {"LEASE_SECONDS": "3", "EFFECT_TIMEOUT_SECONDS": "1", "LEASE_MARGIN_SECONDS": "0.5", "BATCH_SIZE": "100",
             "EFFECT_CONCURRENCY": "256",
             "RETRY_BACKOFF_MS": "100,200,400", "BATCH_WITHIN_SECONDS": "0.5", "BROKER_SESSION_TIMEOUT_SECONDS": "6",
             "BROKER_HEARTBEAT_INTERVAL_SECONDS": "1", "BATCH_DEADLINE_SECONDS": "5", "DLQ_SEND_TIMEOUT_SECONDS": "10",
             # An SMS whose outcome the crash left unknown is verified with the gateway within seconds.
             "SMS_LOOKUP_SETTLE_SECONDS": "2", "DLQ_RETRY_AFTER_SECONDS": "1", "COMPENSATION_TIMER_SECONDS": "1",
             "COMPENSATION_BACKOFF_SECONDS": "1"}


# The providers a run deploys, by the contracts they have: waybill's, then the SMS's.
DEPLOYMENTS = {
    "replays+lookup": {},
    "refuses_duplicates+none": {"EFFECTS__WAYBILL__PROVIDER": "express", "EFFECTS__SMS__LOOKUP": "false"},
}
WAYBILL_SERVICES = ("waybill", "express")


@pytest.fixture
def fakes():
    process = FakesProcess({"waybill": {"latency_ms": 20}, "express": {"latency_ms": 20}, "sms": {"latency_ms": 20}})
    yield process
    process.stop()


def lifecycle(prefix: str):
    confirm = [order_no(prefix=prefix) for _ in range(CONFIRMED)]
    cancel = [order_no(prefix=prefix) for _ in range(CANCELLED)]
    docs = []
    for o in confirm + cancel:
        docs += [event(o, "ORDER_CREATED"), event(o, "ORDER_PAID")]
    docs += [event(o, "ORDER_CONFIRM") for o in confirm] + [event(o, "ORDER_CANCEL") for o in cancel]
    return confirm, cancel, docs


def effect_rows(db, orders, step):
    marks = ", ".join(["%s"] * len(orders))
    keys = [f"{o}:{'ORDER_CONFIRM' if step == 'issue_waybill' else 'ORDER_CANCEL'}:{step}" for o in orders]
    return {r["biz_key"].split(":")[0]: r for r in
            db.query(f"SELECT * FROM t_idem WHERE biz_key IN ({marks})", *keys)}


@pytest.mark.parametrize("deployment", list(DEPLOYMENTS))
@pytest.mark.parametrize("cut", ["before_a", "a_b", "b_c", "after_c"])
def test_sigkill_at_cut_point_then_restart(cut, deployment, settings, topics, spawn_worker, scratch_db, fakes):
    pair = topics(partitions=2)
    confirm, cancel, docs = lifecycle(f"CUT{cut.upper().replace('_', '')}{'X' if DEPLOYMENTS[deployment] else ''}")
    asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
    env = {**CHAOS_ENV, **fakes.env(), **DEPLOYMENTS[deployment]}

    first = spawn_worker(pair, "w1", CHAOS_KILL_AT=cut, **env)
    assert first.wait_exit(90) == -signal.SIGKILL, f"worker did not die at {cut}; log {first.log_path}"
    killed_ledger = fakes.ledger()["counts"]

    second = spawn_worker(pair, "w2", **env)

    def settled():
        waybills = effect_rows(scratch_db, confirm, "issue_waybill")
        sms = effect_rows(scratch_db, cancel, "send_cancel_sms")
        return (len(waybills) == CONFIRMED and all(r["status"] == 2 for r in waybills.values())
                and len(sms) == CANCELLED and all(r["status"] in (2, 3) for r in sms.values()))

    wait_for(settled, timeout=120, what=f"every effect settled after the {cut} crash", workers=[second])
    # ... and the restarted worker has replayed and committed everything the first one left.
    wait_for(lambda: caught_up(settings, pair.events, pair.group, pair.partitions), timeout=120,
             what="offsets committed to the end", workers=[second])
    ledger = fakes.ledger()
    waybill_rows = effect_rows(scratch_db, confirm, "issue_waybill")
    marks = ", ".join(["%s"] * CONFIRMED)
    receipts = {r["order_no"]: r for r in scratch_db.query(
        f"SELECT * FROM t_waybill_receipt WHERE order_no IN ({marks})", *confirm)}
    statuses = {r["order_no"]: r["status"] for r in scratch_db.query(
        f"SELECT order_no, status FROM t_order WHERE order_no IN ({', '.join(['%s'] * len(confirm + cancel))})",
        *confirm, *cancel)}

    for o in confirm:
        assert len(ledger["waybills"].get(o, [])) == 1, f"{o}: waybills {ledger['waybills'].get(o)}"
        assert receipts[o]["waybill_no"] == ledger["waybills"][o][0]
        assert statuses[o] == 3
        keys = {c["key"] for c in ledger["calls"]
                if c["service"] in WAYBILL_SERVICES and (c.get("body") or {}).get("order_no") == o}
        assert keys == {waybill_rows[o]["idem_token"]} == {receipts[o]["idem_token"]}, "token not reused"
    sms_rows = effect_rows(scratch_db, cancel, "send_cancel_sms")
    for o in cancel:
        sent = len(ledger["sms"].get(o, []))
        assert sent <= 1, f"{o}: SMS sent {sent} times"
        assert statuses[o] == 4
        row = sms_rows[o]
        if row["status"] == 2:
            assert sent == 1
        else:
            assert row["outcome"] == "unknown_outcome_non_idempotent"
    if cut in ("before_a", "after_c"):
        assert all(r["status"] == 2 for r in sms_rows.values())
    if DEPLOYMENTS[deployment] and cut == "b_c":
        # The courier refused the replayed references as duplicates; the waybills were looked up.
        tokens = {r["idem_token"] for r in waybill_rows.values()}
        assert any(c["service"] == "express_lookup" and c["key"] in tokens for c in ledger["calls"])
    assert not ledger["refused_signatures"]
    assert ledger["peak_in_flight_per_key"] == 1

    counts = {"cut": cut, "deployment": deployment, "first_worker_calls": killed_ledger, "total": ledger["counts"],
              "unique_waybills": sum(len(v) for v in ledger["waybills"].values()),
              "receipts": len(receipts),
              "sms_rows": Counter(r["status"] for r in sms_rows.values()),
              "waybill_attempts": Counter(r["attempt"] for r in waybill_rows.values())}
    LOGS.mkdir(parents=True, exist_ok=True)
    with open(LOGS / "crash-window-counts.jsonl", "a") as out:
        out.write(json.dumps(counts, default=dict) + "\n")
    second.stop()


@pytest.mark.parametrize("provider", ["waybill", "express"])
def test_the_ledger_catches_a_service_that_ignores_the_idempotency_key(provider, settings, topics, spawn_worker,
                                                                        scratch_db):
    """The same B..C crash against a logistics API that ignores Idempotency-Key (or a courier
    that does not refuse a repeated reference): the replay issues second waybills, and the ledger
    shows them. The invariant above is the provider's contract's doing, and the check can see it fail."""
    fakes = FakesProcess({provider: {"latency_ms": 20, "ignore_idempotency_key": True}})
    try:
        pair = topics(partitions=2)
        confirm, cancel, docs = lifecycle(f"CUTNOKEY{provider[0].upper()}")
        asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
        env = {**CHAOS_ENV, **fakes.env(), "EFFECTS__WAYBILL__PROVIDER": provider}
        first = spawn_worker(pair, "w1", CHAOS_KILL_AT="b_c", **env)
        assert first.wait_exit(90) == -signal.SIGKILL
        called = {c["body"]["order_no"] for c in fakes.ledger()["calls"] if c["service"] == provider}
        assert called, "the first worker made no call before the kill"
        second = spawn_worker(pair, "w2", **env)
        wait_for(lambda: caught_up(settings, pair.events, pair.group, pair.partitions), timeout=120,
                 what="offsets committed to the end", workers=[second])
        waybills = fakes.ledger()["waybills"]
        doubled = {o for o in confirm if len(waybills.get(o, [])) > 1}
        assert doubled == called                 # exactly the orders whose call was replayed
    finally:
        fakes.stop()
