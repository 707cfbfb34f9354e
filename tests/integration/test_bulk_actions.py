"""Bulk actions on the dead-letter queue, on real workers: the dry run's count and sample, the
start refused when the queue moved beyond the tolerance, pause, resume and abort, the audit
trail (the job's id and the person on every row), the CLI's dry run, and 10,000 dead letters
retried by a job whose worker is SIGKILLed in the middle: the other worker takes the job over,
and every row is settled once, with no second waybill and no second SMS."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from harness.bulk_workers import FAST, answering, call
from harness.dead_letters import MANUAL, write_dead_letters
from harness.fakes import FakesProcess
from harness.services import ROOT, wait_for

LET_GO = "no longer run here"          # the runner's line once a job it ran is paused, aborted or taken


def job(worker, job_id: int) -> dict:
    status, doc = call(worker, "GET", f"/bulk/{job_id}")
    assert status == 200, doc
    return doc


@pytest.fixture
def fakes():
    fakes = FakesProcess()
    yield fakes
    fakes.stop()


def test_a_dry_run_counts_exactly_and_a_start_on_a_stale_count_is_refused(scratch_db, topics, spawn_worker, fakes):
    pair = topics(partitions=1)
    write_dead_letters(scratch_db, pair.group, pair.events, 300)
    worker = spawn_worker(pair, **fakes.env(), BULK_RATE_PER_SECOND="100",
                          BULK_CHUNK_SIZE="20", **FAST)
    wait_for(lambda: answering(worker), timeout=90, what="the worker's web views", workers=[worker])
    selection = {"action": "retry", "filter": {"status": "manual", "reason": "effect_unavailable"}}

    status, dry = call(worker, "POST", "/bulk/dry-run", selection)
    assert status == 200 and dry["count"] == 300 and not dry["capped"] and dry["tolerance"] == 3
    ids = [row["id"] for row in dry["sample"]]
    assert len(ids) == 20 and ids == sorted(ids) and {row["status"] for row in dry["sample"]} == {"manual"}
    assert call(worker, "POST", "/bulk/dry-run", {"action": "retry", "filter": {"reason": "nothing_like_it"}})[1][
        "count"] == 0
    assert call(worker, "POST", "/bulk/dry-run", {"action": "retry", "filter": {"status": "compensated"}})[0] == 400

    # The queue moves under the person: 10 more dead letters, beyond 1 % of 300.
    write_dead_letters(scratch_db, pair.group, pair.events, 10, first_offset=300)
    status, refusal = call(worker, "POST", "/bulk/", {**selection, "expected_count": 300, "actor": "alice"})
    assert status == 409 and refusal["count"] == 310 and "changed" in refusal["error"]
    assert scratch_db.scalar("SELECT COUNT(*) FROM t_bulk_job WHERE consumer_group = %s", pair.group) == 0

    # Within the tolerance (309 seen, 310 now): the job takes exactly the 310 rows counted now.
    status, created = call(worker, "POST", "/bulk/", {**selection, "expected_count": 309, "actor": "alice",
                                                      "note": "logistics is back"})
    assert status == 201 and created["total"] == 310 and created["created_by"] == "web:alice", created
    write_dead_letters(scratch_db, pair.group, pair.events, 5, first_offset=400)   # later: not the job's
    done = wait_for(lambda: (j := job(worker, created["id"]))["status"] == "done" and j, timeout=90,
                    what="the job done", workers=[worker])
    assert (done["done"], done["changed"], done["failed"], done["remaining"]) == (310, 310, 0, 0)
    assert done["eta_seconds"] == 0
    assert scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE consumer_group = %s AND status = %s",
                             pair.group, MANUAL) == 5

    # Every row the job touched is audited with the job's id and the person.
    audit = scratch_db.query(
        "SELECT a.compensation_id, a.actor, a.action, a.note, a.to_status FROM t_compensation_audit a JOIN "
        "t_bulk_item i ON i.compensation_id = a.compensation_id AND i.job_id = a.job_id WHERE a.job_id = %s",
        created["id"])
    assert len(audit) == 310 and len({a["compensation_id"] for a in audit}) == 310
    assert {(a["actor"], a["action"], a["note"], a["to_status"]) for a in audit} == {
        ("web:alice", "retry", "logistics is back", 3)}
    waybills = fakes.ledger()["waybills"]
    assert all(len(v) == 1 for v in waybills.values()) and len(waybills) == 310

    # The CLI's dry run counts the same queue: the 5 later rows; its start carries the count.
    assert cli(worker, "retry", "--reason", "effect_unavailable", "--dry-run")["count"] == 5
    assert cli(worker, "discard", "--reason", "effect_unavailable", "--expect", "9", "--yes", code=1) is None
    started = cli(worker, "discard", "--reason", "effect_unavailable", "--expect", "5", "--yes", "--note", "test data",
                  "--actor", "gina")
    assert started["total"] == 5 and started["created_by"] == "cli:gina" and started["action"] == "discard"
    ended = wait_for(lambda: (j := cli(worker, "status", str(started["id"])))["status"] == "done" and j, timeout=60,
                     what="the CLI's job done", workers=[worker])
    assert ended["changed"] == 5 and ended["failures"] == []
    assert cli(worker, "pause", str(started["id"]), code=1) is None           # a finished job stays finished


def cli(worker, *args: str, code: int = 0) -> dict | None:
    """``faust -A app dlq bulk ... --json`` with the worker's settings; its JSON when it succeeds."""
    result = subprocess.run([str(Path(sys.executable).with_name("faust")), "-A", "app", "dlq", "bulk", *args, "--json"],
                            cwd=ROOT, env=worker.env, capture_output=True, text=True, timeout=120)
    assert result.returncode == code, (result.stdout[-2000:], result.stderr[-2000:])
    return json.loads(result.stdout[result.stdout.index("{"):]) if code == 0 else None


def test_a_job_is_paused_resumed_and_aborted_by_a_person(scratch_db, topics, spawn_worker, fakes):
    pair = topics(partitions=1)
    write_dead_letters(scratch_db, pair.group, pair.events, 200)
    worker = spawn_worker(pair, **fakes.env(), BULK_RATE_PER_SECOND="20",
                          BULK_CHUNK_SIZE="10", **FAST)
    wait_for(lambda: answering(worker), timeout=90, what="the worker's web views", workers=[worker])
    selection = {"action": "discard", "filter": {"status": "manual"}}
    count = call(worker, "POST", "/bulk/dry-run", selection)[1]["count"]
    status, created = call(worker, "POST", "/bulk/", {**selection, "expected_count": count, "actor": "bob"})
    assert status == 201
    jid = created["id"]
    wait_for(lambda: job(worker, jid)["done"] >= 20, timeout=60, what="the job under way", workers=[worker])

    status, paused = call(worker, "POST", f"/bulk/{jid}/pause", {"actor": "carol"})
    assert status == 200 and paused["status"] == "paused" and paused["paused_by"] == "web:carol" and paused["changed"]
    assert call(worker, "POST", f"/bulk/{jid}/pause", {"actor": "carol"})[1]["changed"] is False
    # The chunk in flight ends and is recorded; then nothing moves while it is paused. (The pause
    # gives the lease up at once: the owner alone does not say the chunk in flight has ended.)
    wait_for(lambda: LET_GO in worker.logs(), timeout=30, what="the runner letting the paused job go", workers=[worker])
    at_pause = job(worker, jid)
    assert at_pause["owner"] is None
    assert at_pause["eta_seconds"] is None
    settled = scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE consumer_group = %s AND status = 5",
                                pair.group)
    assert settled == at_pause["done"] < 200

    status, resumed = call(worker, "POST", f"/bulk/{jid}/resume", {"actor": "carol"})
    assert status == 200 and resumed["status"] == "running"
    wait_for(lambda: job(worker, jid)["done"] >= at_pause["done"] + 20, timeout=60, what="the job moving again")

    # SIGTERM: the chunk in flight finishes, the lease is given up, the worker exits 0.
    assert worker.stop() == 0
    after_stop = scratch_db.query("SELECT owner, status, done_count FROM t_bulk_job WHERE id = %s", jid)[0]
    assert after_stop["owner"] is None and after_stop["status"] == 1
    assert scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE consumer_group = %s AND status = 2",
                             pair.group) == 0, "a chunk was left claimed"
    assert scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE consumer_group = %s AND status = 5",
                             pair.group) == after_stop["done_count"]
    worker = spawn_worker(pair, "again", **fakes.env(), BULK_RATE_PER_SECOND="20",
                          BULK_CHUNK_SIZE="10", **FAST)
    wait_for(lambda: answering(worker), timeout=90, what="the worker's web views", workers=[worker])
    wait_for(lambda: job(worker, jid)["done"] >= after_stop["done_count"] + 10, timeout=60,
             what="the job taken up by the next worker", workers=[worker])
    assert "taken over from" not in worker.logs()         # it was given up, not taken over
    status, aborted = call(worker, "POST", f"/bulk/{jid}/abort", {"actor": "dave"})
    assert status == 200 and aborted["status"] == "aborted" and aborted["aborted_by"] == "web:dave"
    assert call(worker, "POST", f"/bulk/{jid}/resume", {"actor": "dave"})[0] == 409
    wait_for(lambda: LET_GO in worker.logs(), timeout=30, what="the runner letting the aborted job go",
             workers=[worker])
    final = job(worker, jid)
    assert final["owner"] is None and 0 < final["remaining"] < 200 and final["changed"] == final["done"]
    left = scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE consumer_group = %s AND status = %s",
                             pair.group, MANUAL)
    assert left == final["remaining"]
    audit = scratch_db.query("SELECT actor, action, COUNT(*) AS n FROM t_compensation_audit WHERE job_id = %s "
                             "GROUP BY actor, action", jid)
    assert [(a["actor"], a["action"], a["n"]) for a in audit] == [("web:bob", "discard", final["done"])]


def test_ten_thousand_dead_letters_retried_through_a_worker_kill_are_settled_once(scratch_db, topics, spawn_worker,
                                                                                  fakes):
    fakes.configure({"waybill": {"latency_ms": 40}})       # a chunk's calls take a while: the kill lands among them
    pair = topics(partitions=2)
    confirms = write_dead_letters(scratch_db, pair.group, pair.events, 9_000, prefix="BKILL")
    cancels = write_dead_letters(scratch_db, pair.group, pair.events, 1_000, type_="ORDER_CANCEL", first_offset=9_000,
                                 prefix="BKILL")
    # 20 calls at a time, 40 ms each: a chunk spends most of its time between its first call
    # and its T3, where the kill must land (the lease covers the 11 rounds of 20 calls the compensator may have
    # in flight: its drain, its agent and the chunk).
    env = dict(**fakes.env(), BULK_RATE_PER_SECOND="5000",
               **{**FAST, "EFFECT_CONCURRENCY": "20", "LEASE_SECONDS": "24"})
    first = spawn_worker(pair, "a", **env)
    wait_for(lambda: answering(first), timeout=90, what="the first worker's web views", workers=[first])
    selection = {"action": "retry", "filter": {"status": "manual"}}
    count = call(first, "POST", "/bulk/dry-run", selection)[1]["count"]
    assert count == 10_000
    status, created = call(first, "POST", "/bulk/", {**selection, "expected_count": count, "actor": "erin"})
    assert status == 201
    jid = created["id"]
    # The first worker runs the job alone until it has done a good part of it; then the second
    # starts, and the first is killed in the middle of a chunk.
    wait_for(lambda: job(first, jid)["done"] >= 1_500, timeout=60, what="1,500 rows done by the first worker",
             workers=[first])
    second = spawn_worker(pair, "b", **env)
    wait_for(lambda: answering(second), timeout=90, what="the second worker's web views", workers=[second])
    held = job(second, jid)
    assert held["status"] == "running" and held["owner"] and "-a/bulk/" in held["owner"], held

    def calls_not_yet_recorded() -> bool:
        """Waybills the fake issued whose step the first worker has not marked done yet: its
        chunk is between the calls and their T3, the window a takeover must redo safely."""
        done = scratch_db.scalar("SELECT COUNT(*) FROM t_idem WHERE step = 'issue_waybill' AND status = 2 "
                                 "AND biz_key LIKE 'ORD-%%-BKILL%%'")
        return fakes.ledger()["counts"]["waybills"] > done

    def frozen_between_calls_and_t3() -> bool:
        """Stop the first worker (SIGSTOP) and look: kill it frozen in that window, or let it go
        on. Looking at a running worker and then killing it races its T3 (a run once saw the T3
        commit in between, and nothing was left to redo). A T3 sent just before the stop still
        commits on the server: the second look, half a second later, sees it."""
        first.kill(signal.SIGSTOP)
        caught = False
        try:
            caught = calls_not_yet_recorded() and (time.sleep(0.5) or calls_not_yet_recorded())
        finally:
            first.kill(signal.SIGKILL if caught else signal.SIGCONT)
        return caught

    wait_for(frozen_between_calls_and_t3, timeout=60, interval=0.02, what="a chunk between its calls and their T3",
             workers=[first])
    first.wait_exit(30)
    fakes.configure({"waybill": {"latency_ms": 0}})
    at_kill = job(second, jid)["done"]
    assert at_kill < 10_000, "the job ended before the kill: nothing was taken over"

    done = wait_for(lambda: (j := job(second, jid))["status"] == "done" and j, timeout=120,
                    what="the job done by the second worker", workers=[second])
    assert "taken over from" in second.logs() and done["done"] == 10_000 and done["remaining"] == 0
    # Rows the job left open (a claim of the killed worker in the way) the drain finishes.
    wait_for(lambda: scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE consumer_group = %s AND status <> 3",
                                       pair.group) == 0, timeout=90, what="every row compensated", workers=[second])

    ids = [r["id"] for r in scratch_db.query("SELECT id FROM t_compensation WHERE consumer_group = %s", pair.group)]
    settled = Counter(r["compensation_id"] for r in scratch_db.query(
        "SELECT compensation_id FROM t_compensation_audit WHERE to_status = 3 AND compensation_id IN "
        "(SELECT id FROM t_compensation WHERE consumer_group = %s)", pair.group))
    assert len(ids) == 10_000 and all(settled[i] == 1 for i in ids), "a row was settled twice, or never"
    changed = {r["compensation_id"] for r in scratch_db.query(
        "SELECT compensation_id FROM t_bulk_item WHERE job_id = %s AND outcome = 'changed'", jid)}
    by_job = Counter(r["compensation_id"] for r in scratch_db.query(
        "SELECT compensation_id FROM t_compensation_audit WHERE job_id = %s AND action = 'retry' AND to_status = 3",
        jid))
    assert set(by_job) == changed and set(by_job.values()) == {1} and done["changed"] == len(changed)
    assert len(changed) > 9_000

    ledger = fakes.ledger()
    assert all(len(ledger["waybills"].get(o, [])) == 1 for o in confirms), "a second waybill, or none"
    # Some rows were called by the first worker and called again by the second (with the same
    # key: the same waybill came back), so the takeover's redo was put to the test.
    calls = Counter(c["body"]["order_no"] for c in ledger["calls"] if c["service"] == "waybill")
    assert any(n > 1 for n in calls.values()), "no row whose call was made was redone after the takeover"
    assert all(len(ledger["sms"].get(o, [])) == 1 for o in cancels), "a second SMS, or none"
    assert ledger["counts"]["waybills"] == 9_000 and ledger["counts"]["sms"] == 1_000
    orders = scratch_db.query("SELECT status, COUNT(*) AS n FROM t_order WHERE order_no IN (SELECT order_no FROM "
                              "t_compensation WHERE consumer_group = %s) GROUP BY status", pair.group)
    assert {o["status"]: o["n"] for o in orders} == {3: 9_000, 4: 1_000}
    steps = scratch_db.query("SELECT step, status, COUNT(*) AS n FROM t_idem WHERE biz_key LIKE 'ORD-%%-BKILL%%' "
                             "GROUP BY step, status")
    assert {(r["step"], r["status"]): r["n"] for r in steps} == {
        ("mark_confirmed", 2): 9_000, ("issue_waybill", 2): 9_000, ("mark_cancelled", 2): 1_000,
        ("send_cancel_sms", 2): 1_000}, "an effect step is not done"
