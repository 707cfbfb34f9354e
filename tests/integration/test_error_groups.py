"""Error groups on real MariaDB with the fake services over real HTTP: the dead letters of one
outage are one group with the right counts and inflow; a redrive that fails for a new reason
moves its row to the new group; a replay, or two workers writing the same letters at once,
counts nothing twice; the migration groups the rows written before it; a row the compensator
opens for an unreadable letter joins its group once. After each, the hourly summary equals a
recount of the ledger."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime

from app.adapters.mysql.ledger.port import MySqlLedger
from app.adapters.mysql.reads.error_groups import WINDOWS, GroupQueries
from app.compensation.fingerprints import fingerprint
from app.compensation.rules import Backoff
from app.pipeline.model import SourceKey
from app.pipeline.ports import DeadLetter, SourceRecord
from app.pipeline.states import LedgerStatus as Status
from harness import sql_modes
from harness.desk import desk
from harness.events import event, order_no
from harness.pipeline import paid_orders
from harness.services import ScratchDatabase

settings, scratch_db = sql_modes.each_sql_mode()


def summary(harness, group: str) -> dict[tuple[str, datetime], int]:
    return {(r["fingerprint"], r["hour"]): r["letters"] for r in harness.db.query(
        "SELECT fingerprint, hour, letters FROM t_error_group_hour WHERE consumer_group = %s AND letters <> 0",
        group)}


def recount(harness, group: str) -> dict[tuple[str, datetime], int]:
    return {(r["fingerprint"], r["hour"]): r["n"] for r in harness.db.query(
        "SELECT fingerprint, DATE_FORMAT(first_failure_at, '%%Y-%%m-%%d %%H:00:00') AS hour, COUNT(*) AS n "
        "FROM t_compensation WHERE consumer_group = %s GROUP BY fingerprint, "
        "DATE_FORMAT(first_failure_at, '%%Y-%%m-%%d %%H:00:00')", group)}


def assert_summary_is_the_ledger(harness, group: str) -> None:
    recounted = {(fp, datetime.fromisoformat(str(hour))): n for (fp, hour), n in recount(harness, group).items()}
    assert summary(harness, group) == recounted and None not in {fp for fp, _ in recounted}


async def test_the_dead_letters_of_one_outage_are_one_group_with_its_counts_and_inflow(harness):
    d = await desk(harness)
    orders = await paid_orders(d.main, 6, "GRPOUT")
    down, refused = orders[:5], orders[5:]
    harness.fakes.configure({"waybill": {"fail_orders": down, "fail_status": 503, "reject_orders": refused}})
    await d.dead_letters([event(order, "ORDER_CONFIRM") for order in orders])

    rows = harness.db.query("SELECT order_no, reason, fingerprint FROM t_compensation WHERE consumer_group = %s",
                            d.group)
    outage = {r["fingerprint"] for r in rows if r["order_no"] in down}
    assert len(rows) == 6 and len(outage) == 1 and None not in outage
    [other] = {r["fingerprint"] for r in rows if r["order_no"] in refused}
    [fp] = outage
    assert other != fp

    listing = await GroupQueries(d.main.store, group=d.group).groups(WINDOWS["24h"], unsettled_only=False)
    by_fp = {g["fingerprint"]: g for g in listing["groups"]}
    assert set(by_fp) == {fp, other} and listing["groups"][0]["fingerprint"] == fp      # the largest first
    group = by_fp[fp]
    assert (group["letters"], group["open"], group["orders"], group["open_share"]) == (5, 5, 5, 1.0)
    assert (group["reason"], group["effect"], group["detail"]) == ("effect_unavailable", "waybill", "503")
    assert group["sample"].startswith("waybill for ORD-") and group["first_seen"] <= group["last_seen"]
    assert (by_fp[other]["reason"], by_fp[other]["detail"], by_fp[other]["letters"]) == ("effect_rejected", "422", 1)
    assert listing["queue"]["depth"] == 6 and listing["queue"]["oldest_open_age_seconds"] >= 0

    one = await GroupQueries(d.main.store, group=d.group).group(fp)
    day, week = one["windows"]["24h"], one["windows"]["7d"]
    assert [p["letters"] for p in day["series"]][-1] == 5 and sum(p["letters"] for p in day["series"]) == 5
    assert len(day["series"]) == 24 and day["bucket_hours"] == 1
    assert sum(p["letters"] for p in week["series"]) == 5 and week["bucket_hours"] == 6
    assert one["queue"]["depth"] == 6 and one["letters_total"] == 5
    assert_summary_is_the_ledger(harness, d.group)


async def test_a_redrive_that_fails_for_a_new_reason_moves_its_row_to_the_new_group(harness):
    d = await desk(harness, backoff=Backoff(0.2, 0.4, 5))
    orders = await paid_orders(d.main, 3, "GRPMOVE")
    harness.fakes.configure({"waybill": {"fail_orders": orders, "fail_status": 503}})
    letters = await d.dead_letters([event(order, "ORDER_CONFIRM") for order in orders])
    [before] = {d.row(letter)["fingerprint"] for letter in letters}
    assert await d.compensator.handle_dead_letter(letters[0], d.guard) == "open"      # still 503: same group
    assert d.row(letters[0])["fingerprint"] == before and d.row(letters[0])["redrives"] == 1
    await asyncio.sleep(0.5)                                                         # its backoff runs out

    harness.fakes.configure({"waybill": {"fail_orders": [], "reject_orders": [orders[0]]}})   # now refused
    assert await d.compensator.handle_dead_letter(letters[0], d.guard) == "manual"
    moved = d.row(letters[0])
    assert (moved["status"], moved["reason"]) == (Status.MANUAL, "effect_rejected")
    assert moved["fingerprint"] not in (None, before)
    assert moved["fingerprint"] == fingerprint(moved["reason"], moved["message"])

    queries = GroupQueries(d.main.store, group=d.group)
    by_fp = {g["fingerprint"]: g for g in (await queries.groups(WINDOWS["7d"], unsettled_only=True))["groups"]}
    assert (by_fp[before]["letters"], by_fp[before]["open"]) == (2, 2)
    assert (by_fp[moved["fingerprint"]]["letters"], by_fp[moved["fingerprint"]]["open"]) == (1, 1)
    assert_summary_is_the_ledger(harness, d.group)

    # A run that ends well keeps the row in the group it failed in; the group's open share drops.
    harness.fakes.configure({"waybill": {"fail_orders": []}})
    assert await d.compensator.handle_dead_letter(letters[1], d.guard) == "compensated"
    assert d.row(letters[1])["fingerprint"] == before
    by_fp = {g["fingerprint"]: g for g in (await queries.groups(WINDOWS["24h"], unsettled_only=False))["groups"]}
    assert (by_fp[before]["letters"], by_fp[before]["open"], by_fp[before]["open_share"]) == (2, 1, 0.5)
    assert_summary_is_the_ledger(harness, d.group)


def letter(topic: str, offset: int, order: str, message: str) -> DeadLetter:
    record = SourceRecord(topic, 0, offset, 1_700_000_000_000 + offset, b"k", b"v")
    return DeadLetter(record=record, reason="effect_unavailable", message=message, retriable=True, attempts=3,
                      first_failure_at=datetime.now(UTC), order_no=order)


async def test_a_replay_or_two_workers_writing_the_same_letters_count_each_once(harness):
    store = (await harness.processor(owner=f"w/main/{order_no()}")).store
    other = harness.store()
    group, topic = f"grp-{order_no()[-8:]}", f"t-{order_no()[-8:]}"
    letters = [letter(topic, i, order_no(), f"logistics for ORD-20261201-{i:04d}: answered 503") for i in range(40)]

    async def write(s, some):
        await s.in_transaction(lambda tx: tx.record_dead_letters(some, group=group, retry_after_seconds=60))

    await asyncio.gather(write(store, letters), write(other, list(reversed(letters))))
    await write(store, letters[:10])                                       # a replay after a crash
    [(fp, _)] = summary(harness, group)
    assert sum(summary(harness, group).values()) == 40
    assert_summary_is_the_ledger(harness, group)

    # The same records come back for another cause: they move, the count stays.
    again = [replace(one, message=f"logistics for {one.order_no}: ClientConnectorError: Cannot connect to host "
                                  f"10.0.0.{i}:8080") for i, one in enumerate(letters[:15])]
    await asyncio.gather(write(store, again), write(other, again))
    counts = {}
    for (f, _), n in summary(harness, group).items():
        counts[f] = counts.get(f, 0) + n
    assert counts[fp] == 40 and len(counts) == 1        # same reason: the ledger keeps the first message
    again = [replace(one, reason="effect_not_delivered") for one in again]
    await asyncio.gather(write(store, again), write(other, again))
    counts = {}
    for (f, _), n in summary(harness, group).items():
        counts[f] = counts.get(f, 0) + n
    assert counts.pop(fp) == 25 and list(counts.values()) == [15]
    assert_summary_is_the_ledger(harness, group)


def test_the_migration_gives_the_rows_written_before_it_their_groups_and_counts(settings):
    db = ScratchDatabase(settings.database.url, sql_mode=settings.database.sql_mode).create(migrated=False)
    try:
        db.migrate("0009")
        for i, (reason, message) in enumerate([("effect_unavailable", "logistics for ORD-20261201-A1: answered 503"),
                                               ("effect_unavailable", "logistics for ORD-20261201-B2: answered 503"),
                                               ("malformed", "not JSON at byte 17")]):
            db.query("INSERT INTO t_compensation (src_topic, src_partition, src_offset, consumer_group, status, "
                     "reason, message, retriable, attempts, first_failure_at) VALUES ('t', 0, %s, 'g', 4, %s, %s, 0, "
                     "1, UTC_TIMESTAMP(3) - INTERVAL %s HOUR)", i, reason, message, 30 * i)
        db.migrate("head")
        rows = db.query("SELECT reason, message, fingerprint FROM t_compensation ORDER BY src_offset")
        assert [r["fingerprint"] for r in rows] == [fingerprint(r["reason"], r["message"]) for r in rows]
        assert rows[0]["fingerprint"] == rows[1]["fingerprint"] != rows[2]["fingerprint"]
        assert sorted(r["letters"] for r in db.query("SELECT letters FROM t_error_group_hour")) == [1, 1, 1]
        assert {r["fingerprint"]: r["reason"] for r in db.query("SELECT * FROM t_error_group")} == \
            {rows[0]["fingerprint"]: "effect_unavailable", rows[2]["fingerprint"]: "malformed"}
        db.migrate("0009", down=True)
        assert not db.query("SHOW TABLES LIKE 't_error_group%%'")
    finally:
        db.drop()


async def test_a_row_the_compensator_opens_for_an_unreadable_letter_joins_its_group_once(harness):
    store = (await harness.processor(owner=f"w/main/{order_no()}")).store
    ledger = MySqlLedger(store)
    group = f"grp-{order_no()[-8:]}"
    for offset in (1, 2, 2):                              # the second letter read twice
        source = SourceKey(group, "test-dlq", 0, offset, 5)
        await ledger.add_manual(source, SourceRecord("test-dlq", 0, offset, 5, None, b"?"), "unreadable_dead_letter",
                                f"missing dlq.original.topic in the letter at offset {offset}")
    [(fp, _)] = summary(harness, group)
    assert sum(summary(harness, group).values()) == 2
    assert fp == fingerprint("unreadable_dead_letter", "missing dlq.original.topic in the letter at offset 9")
    assert_summary_is_the_ledger(harness, group)
