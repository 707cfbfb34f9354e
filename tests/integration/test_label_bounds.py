"""No producer can create metric series or error groups: 1,000 records with random schema versions,
1,000 with random unknown types and 1,000 with random types that look like handled ones, through a
real worker, leave a handful of series per metric on /metrics and one error group per cause, while
each letter keeps the version or type its record named."""

from __future__ import annotations

import asyncio
import random
import re
import string
import urllib.request

from harness.events import event, order_no, record
from harness.services import caught_up, produce, wait_for

ALPHABET = string.ascii_letters + string.digits + "._-:/'\" ;{}()"
LABELLED = ("order_dead_letters_total", "order_events_malformed_total", "order_events_skipped_total",
            "order_record_retries_total", "order_events_total")


def series(worker) -> dict[str, set[str]]:
    """Each labelled metric's series on the worker's /metrics (their label sets as written there)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode()
    found: dict[str, set[str]] = {name: set() for name in LABELLED}
    for name, labels in re.findall(r"^([a-z_]+)(\{[^}]*\}) \S+$", text, re.M):
        if name in found:
            found[name].add(labels)
    return found


def test_random_versions_and_types_leave_a_bounded_number_of_series_and_groups(settings, topics, spawn_worker,
                                                                                scratch_db):
    rng = random.Random(51)

    def noise(n: int) -> str:
        return "".join(rng.choice(ALPHABET) for _ in range(n))

    pair = topics(partitions=2)
    records = []
    for i in range(1000):
        order = order_no(prefix="LBV")
        records.append(record(event(order, "ORDER_CREATED" if i % 2 else "ORDER_PAID", schema_version=noise(16))))
    for _ in range(1000):
        records.append(record(event(order_no(prefix="LBT"), "ORDER_PAID", type="X_" + noise(20))))
    for i in range(1000):
        handled = "ORDER_CONFIRM" if i % 2 else "ORDER_CANCEL"
        records.append(record(event(order_no(prefix="LBL"), "ORDER_PAID", type=f"{handled}_{noise(12)}")))
    asyncio.run(produce(settings, pair.events, records))
    worker = spawn_worker(pair, METRICS_REFRESH_SECONDS="0.5", RECONCILE_EVERY_SECONDS="0")
    wait_for(lambda: caught_up(settings, pair.events, pair.group, 2), timeout=240, what="every record committed",
             workers=[worker])

    got = series(worker)
    reasons = {'{reason="unsupported_version"}', '{reason="lookalike_type"}'}
    assert got["order_dead_letters_total"] == reasons, sorted(got["order_dead_letters_total"])[:5]
    assert got["order_events_malformed_total"] == reasons, sorted(got["order_events_malformed_total"])[:5]
    assert got["order_events_skipped_total"] == {'{type="other"}'}, sorted(got["order_events_skipped_total"])[:5]
    assert len(got["order_events_total"]) <= 8 and len(got["order_record_retries_total"]) <= 20, got

    rows = scratch_db.query("SELECT reason, fingerprint FROM t_compensation WHERE consumer_group = %s", pair.group)
    assert len(rows) == 2000
    # The letter keeps what its record named; the groups do not multiply with it.
    assert len({r["reason"] for r in rows if r["reason"].startswith("unsupported_version:")}) > 900
    groups = scratch_db.query("SELECT reason, COUNT(*) AS n FROM t_error_group WHERE consumer_group = %s "
                              "GROUP BY reason", pair.group)
    assert {g["reason"]: g["n"] for g in groups} == {"unsupported_version": 2, "lookalike_type": 2}
    assert len({r["fingerprint"] for r in rows}) == 4
    print(f"{len(records):,} records: series {({k: len(v) for k, v in got.items()})}, "
          f"{len({r['fingerprint'] for r in rows})} error groups")
    wait_for(lambda: scratch_db.scalar("SELECT COALESCE(SUM(skipped), 0) FROM t_skipped_type WHERE "
                                       "consumer_group = %s", pair.group) == 1000, timeout=30,
             what="the skipped records counted in t_skipped_type", workers=[worker])
    skipped_rows = scratch_db.scalar("SELECT COUNT(*) FROM t_skipped_type WHERE consumer_group = %s", pair.group)
    assert skipped_rows <= 101         # a worker's first 100 names, the rest as `other`
