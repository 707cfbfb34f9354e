"""The operator controls against real workers, Kafka and MariaDB (``app.pipeline.controls``).

* An SMS hold while orders flow, with a worker SIGKILLed and a rebalance during the hold: no SMS
  while it lasts, every SMS once after it (each sent after the release), no dead letter, and every
  waybill on time (the waybills are not held). The hold is made with the CLI and ended over HTTP.
* A partition paused with a rebalance in the middle: none of its records is worked while it is
  paused, whichever worker owns it, the other partition flows, and the resume reads it from its
  first record held back. Paused over HTTP, resumed with the CLI.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from app.adapters.kafka import ops as kafka_ops
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import ROOT, caught_up, committed_offsets, end_offsets, wait_for, worker_env, worker_metric

OPERATOR = "operator-token-of-the-controls-test"
ENV = {"WEB_TOKEN": OPERATOR, "CONTROLS_REFRESH_SECONDS": "0.5", "BATCH_WITHIN_SECONDS": "0.2",
       "BROKER_COMMIT_INTERVAL_SECONDS": "0.5", "METRICS_REFRESH_SECONDS": "1"}


def cli(env: dict[str, str], *args: str) -> dict:
    """``faust -A app <args>`` with a worker's settings; its JSON answer."""
    done = subprocess.run([str(os.path.join(os.path.dirname(sys.executable), "faust")), "-A", "app", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout[done.stdout.index("{"):])


def post(worker, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{worker.web_port}{path}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json",
                                                             "Authorization": f"Bearer {OPERATOR}"})
    return json.loads(urllib.request.urlopen(request, timeout=30).read())


def metric_everywhere(workers, name: str, labels: str, value: float) -> bool:
    return all(worker_metric(worker, name, labels) == value for worker in workers)


def held_records(workers, effect: str) -> float:
    return sum(worker_metric(worker, "order_records_held_by_effect", f'{{effect="{effect}"}}') or 0
               for worker in workers)


@pytest.fixture
def fakes():
    process = FakesProcess({"waybill": {"latency_ms": 20}, "sms": {"latency_ms": 20}})
    yield process
    process.stop()


def test_an_sms_hold_sends_nothing_while_it_lasts_and_every_sms_once_after_it_through_a_kill_and_a_rebalance(
        settings, topics, spawn_worker, scratch_db, fakes):
    pair = topics(partitions=4)
    a = spawn_worker(pair, name="a", **fakes.env(), **ENV)
    b = spawn_worker(pair, name="b", **fakes.env(), **ENV)
    env = worker_env(MYSQL_URL=scratch_db.url, **pair.env(), **fakes.env(), **ENV)
    held = cli(env, "hold", "start", "--effect", "sms", "--hours", "1", "--until-released",
               "--reason", "the SMS gateway's maintenance", "--actor", "alice")["held"]
    assert held["active"] and held["held_by"] == "cli:alice"
    wait_for(lambda: metric_everywhere([a, b], "order_effect_held", '{effect="sms"}', 1), timeout=60,
             what="both workers holding sms", workers=[a, b])

    confirmed = [order_no(prefix="HOLDW") for _ in range(20)]
    cancelled = [order_no(prefix="HOLDS") for _ in range(20)]
    docs = [event(o, t) for o in confirmed for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
    docs += [event(o, t) for o in cancelled for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CANCEL")]
    asyncio.run(kafka_ops.produce(settings.kafka.bootstrap, pair.events, [record(d) for d in docs]))

    def waybills() -> int:
        return sum(len(v) for o, v in fakes.ledger()["waybills"].items() if o in confirmed)

    # The waybills are not held: every one on time; the cancels wait, held, before their claim.
    wait_for(lambda: waybills() == len(confirmed), timeout=120, what="every waybill during the hold",
             workers=[a, b])
    wait_for(lambda: held_records([a, b], "sms") == len(cancelled), timeout=60, what="every cancel held",
             workers=[a, b])

    # A worker killed mid-hold: its held records were never acked; whoever gets its partitions holds them.
    b.kill()
    b.wait_exit(30)
    c = spawn_worker(pair, name="c", **fakes.env(), **ENV)
    wait_for(lambda: metric_everywhere([a, c], "order_effect_held", '{effect="sms"}', 1), timeout=60,
             what="the new worker holding sms", workers=[a, c])
    wait_for(lambda: held_records([a, c], "sms") == len(cancelled), timeout=120,
             what="every cancel held again after the kill and the rebalance", workers=[a, c])
    assert fakes.ledger()["counts"]["sms"] == 0
    assert not scratch_db.query("SELECT id FROM t_compensation WHERE consumer_group = %s", pair.group)

    released_at = time.time()
    ended = post(a, f"/controls/holds/{held['id']}/release", {"note": "the gateway is back"})["ended"]
    assert [hold["effect"] for hold in ended] == ["sms"]
    wait_for(lambda: {o: len(m) for o, m in fakes.ledger()["sms"].items() if o in cancelled}
             == {o: 1 for o in cancelled}, timeout=120, what="every SMS once after the hold", workers=[a, c])
    sent = [message["at"] for o, messages in fakes.ledger()["sms"].items() if o in cancelled for message in messages]
    assert min(sent) >= released_at - 1.0          # none while it lasted (the fakes' clock is this machine's)
    wait_for(lambda: caught_up(settings, pair.events, pair.group, 4), timeout=120, what="everything committed",
             workers=[a, c])
    assert not scratch_db.query("SELECT id FROM t_compensation WHERE consumer_group = %s", pair.group)
    assert waybills() == len(confirmed)
    audit = [row["action"] for row in scratch_db.query(
        "SELECT action FROM t_control_audit WHERE consumer_group = %s ORDER BY id", pair.group)]
    assert audit == ["hold", "release"]


def test_a_paused_partition_is_not_worked_through_a_rebalance_and_is_read_again_from_its_first_record_held_back(
        settings, topics, spawn_worker, scratch_db, fakes):
    pair = topics(partitions=2)
    a = spawn_worker(pair, name="a", **fakes.env(), **ENV)
    wait_for(lambda: worker_metric(a, "order_controls_read_timestamp_seconds"), timeout=60,
             what="the worker reading its controls", workers=[a])
    paused = post(a, "/controls/pauses/", {"partition": 1, "reason": "a poisoned stretch upstream"})
    assert paused["new"] and paused["paused"]["partition"] == 1
    wait_for(lambda: worker_metric(a, "order_partition_paused", f'{{partition="1",topic="{pair.events}"}}') == 1,
             timeout=60, what="the pause read by the worker", workers=[a])

    def produce(prefix: str) -> dict[int, list[str]]:
        orders = [order_no(prefix=prefix) for _ in range(30)]
        placed = asyncio.run(kafka_ops.produce(settings.kafka.bootstrap, pair.events,
                                               [record(event(o, "ORDER_CREATED")) for o in orders]))
        by_partition: dict[int, list[str]] = {0: [], 1: []}
        for order, (partition, _) in zip(orders, placed):
            by_partition[partition].append(order)
        assert by_partition[0] and by_partition[1]
        return by_partition

    def made(orders: list[str]) -> int:
        if not orders:
            return 0
        marks = ", ".join(["%s"] * len(orders))
        return scratch_db.scalar(f"SELECT COUNT(*) FROM t_order WHERE order_no IN ({marks})", *orders)

    def committed(partition: int) -> int | None:
        return asyncio.run(committed_offsets(settings, pair.group, pair.events, 2)).get(partition)

    first = produce("PAUSEA")
    ends = asyncio.run(end_offsets(settings, pair.events, 2))
    wait_for(lambda: made(first[0]) == len(first[0]) and committed(0) == ends[0], timeout=120,
             what="partition 0 worked and committed", workers=[a])
    assert made(first[1]) == 0 and (committed(1) or 0) < ends[1]

    # A rebalance in the middle: whoever owns partition 1 now holds it back the same way.
    b = spawn_worker(pair, name="b", **fakes.env(), **ENV)
    wait_for(lambda: worker_metric(b, "order_partition_paused", f'{{partition="1",topic="{pair.events}"}}') == 1,
             timeout=60, what="the pause read by the new worker", workers=[a, b])
    second = produce("PAUSEB")
    ends = asyncio.run(end_offsets(settings, pair.events, 2))
    wait_for(lambda: made(second[0]) == len(second[0]) and committed(0) == ends[0], timeout=120,
             what="partition 0 worked after the rebalance", workers=[a, b])
    assert made(first[1]) == 0 and made(second[1]) == 0 and (committed(1) or 0) < ends[1]

    env = worker_env(MYSQL_URL=scratch_db.url, **pair.env(), **fakes.env(), **ENV)
    resumed = cli(env, "pause", "end", "--partition", "1", "--note", "the stretch was fixed upstream", "--actor", "bob")
    assert resumed["resumed"]["partition"] == 1
    wait_for(lambda: made(first[1] + second[1]) == len(first[1] + second[1]), timeout=120,
             what="partition 1 worked once resumed", workers=[a, b])
    wait_for(lambda: caught_up(settings, pair.events, pair.group, 2), timeout=120, what="everything committed",
             workers=[a, b])
    assert not scratch_db.query("SELECT id FROM t_compensation WHERE consumer_group = %s", pair.group)
