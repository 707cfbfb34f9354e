"""When a dead letter comes due, on real MariaDB: at the time its error names (a lease's end, an
unknown outcome's settle) rather than ``DLQ_RETRY_AFTER_SECONDS`` later; the drain, asleep, wakes
for it; and a dead compensator's claims on ledger rows end at its death, not at their lease's end."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from app.adapters.mysql.ledger.port import MySqlLedger
from app.pipeline.ports import DeadLetter, SourceRecord
from app.pipeline.states import LedgerStatus as Status
from harness.desk import desk
from harness.events import event
from harness.pipeline import paid_orders

RETRY_AFTER = 600


def letter(offset: int, *, retry_in: float | None) -> DeadLetter:
    record = SourceRecord("t-due-times", 0, offset, 1764000000000 + offset, b"k", b"{}", ())
    return DeadLetter(record=record, reason="effect_outcome_unknown", message="settling", retriable=True, attempts=1,
                      first_failure_at=datetime.now(UTC), retry_in=retry_in)


async def record(d, letters: list[DeadLetter]) -> None:
    await d.main.store.in_transaction(lambda tx: tx.record_dead_letters(letters, group=d.group,
                                                                        retry_after_seconds=RETRY_AFTER))


def due_in(d, offset: int) -> float:
    return d.h.db.scalar("SELECT TIMESTAMPDIFF(MICROSECOND, NOW(3), next_retry_at) FROM t_compensation "
                         "WHERE consumer_group = %s AND src_offset = %s", d.group, offset) / 1e6


async def test_a_dead_letter_whose_error_says_when_a_retry_may_help_comes_due_then(harness):
    d = await desk(harness)
    await record(d, [letter(1, retry_in=3.0), letter(2, retry_in=None), letter(3, retry_in=0.01)])
    assert 0.5 < due_in(d, 1) <= 3.0                    # the error's wait, not DLQ_RETRY_AFTER_SECONDS
    assert RETRY_AFTER - 5 < due_in(d, 2) <= RETRY_AFTER
    assert 0.0 < due_in(d, 3) <= 1.0                    # at least a second from when it was written
    assert 0.0 <= await d.ledger.next_due(d.group) <= 1.0

    await asyncio.sleep(max(due_in(d, 3), 0) + 0.05)
    assert await d.compensator.run_due(10, d.guard) == 1     # letter 3 only (no event in it: to a person)
    assert 0.0 <= await d.ledger.next_due(d.group) <= 3.0     # then letter 1, not letter 2


async def test_the_drain_asleep_wakes_when_a_dead_letter_comes_due_sooner_than_its_next_look(harness):
    d = await desk(harness, retry_after=1)
    longest = 600.0                                          # COMPENSATION_TIMER_SECONDS, as if long
    sleeper = asyncio.create_task(d.compensator.sleep_until_due(d.guard, longest))
    [order] = await paid_orders(d.main, 1, "DUEWAKE")
    harness.fakes.configure({"waybill": {"fail_next": 4}})
    [dead] = await d.dead_letters([event(order, "ORDER_CONFIRM")])     # due in a second
    assert not sleeper.done()                                # nothing was due: it slept
    assert await d.compensator.handle_dead_letter(dead, d.guard) == "not_due"    # the dead-letter agent's turn
    await asyncio.wait_for(sleeper, 60)                      # woke for the letter, not after 600 s
    assert await d.compensator.run_due(10, d.guard) == 1
    assert d.row(dead)["status"] == Status.COMPENSATED


async def test_a_dead_compensators_claims_on_ledger_rows_end_at_its_death(harness):
    d = await desk(harness)
    await record(d, [letter(20, retry_in=0.01)])
    row_id = d.h.db.scalar("SELECT id FROM t_compensation WHERE consumer_group = %s AND src_offset = 20", d.group)
    dead_owner = "w-dead/compensator/0badc0ffee00#1"         # <worker_id>/<role>/<run>#n
    d.h.db.query("UPDATE t_compensation SET status = %s, owner = %s, lease_until = NOW(3) + INTERVAL 5 MINUTE "
                 "WHERE id = %s", int(Status.RETRYING), dead_owner, row_id)
    d.h.db.query("INSERT INTO t_worker (incarnation, worker_id, started_at, last_seen) "
                 "VALUES ('w-dead/0badc0ffee00', 'w-dead', NOW(3) - INTERVAL 2 MINUTE, NOW(3) - INTERVAL 1 MINUTE)")
    alive = "w-alive/compensator/0123456789ab#1"

    without_heartbeats = MySqlLedger(d.main.store)
    assert await without_heartbeats.claim_due(d.group, 10, alive, 30) == []          # its lease still runs
    with_heartbeats = MySqlLedger(d.main.store, dead_after=15)
    [claimed] = await with_heartbeats.claim_due(d.group, 10, alive, 30)            # its owner died a minute ago
    assert claimed.id == row_id
    assert d.h.db.scalar("SELECT owner FROM t_compensation WHERE id = %s", row_id) == alive


async def test_a_live_compensators_claims_on_ledger_rows_are_left_alone(harness):
    d = await desk(harness)
    await record(d, [letter(30, retry_in=0.01)])
    row_id = d.h.db.scalar("SELECT id FROM t_compensation WHERE consumer_group = %s AND src_offset = 30", d.group)
    d.h.db.query("UPDATE t_compensation SET status = %s, owner = 'w-live/compensator/0badc0ffee01#1', "
                 "lease_until = NOW(3) + INTERVAL 5 MINUTE WHERE id = %s", int(Status.RETRYING), row_id)
    d.h.db.query("INSERT INTO t_worker (incarnation, worker_id, started_at, last_seen) "
                 "VALUES ('w-live/0badc0ffee01', 'w-live', NOW(3) - INTERVAL 2 MINUTE, NOW(3))")
    assert await MySqlLedger(d.main.store, dead_after=15).claim_due(d.group, 10, "w-other/compensator/1#1", 30) == []
