"""The compensation ledger's statements, held to its state machine (``LEDGER_TRANSITIONS`` in
``app/pipeline/states.py``), as ``t_idem``'s are to theirs: from every status, every write the
compensator and a person make, asked for every status, on real MariaDB. A write moves a row
only where the table allows; every move the table allows, one of them makes."""

from __future__ import annotations

import itertools

import pytest

from app.adapters.mysql import MySqlStore, MySqlTransaction
from app.adapters.mysql.engine import create_engine
from app.adapters.mysql.ledger import statements as ledger
from app.pipeline.states import LEDGER_TRANSITIONS, LedgerStatus, ledger_move_allowed
from harness import sql_modes

settings, scratch_db = sql_modes.each_sql_mode()

ME, OTHER = "compensator/ledger-moves/1", "compensator/ledger-moves/2"
TOPIC, GROUP = "t-ledger-moves", "g-ledger-moves"
EVERY = frozenset(LedgerStatus)
_offsets = itertools.count(1)
# Moves only the writing of a dead letter makes (``ledger.record``: a row's first status, or the
# same record dead-lettered again for another reason); the writes below start from a row.
BY_RECORD = {(None, LedgerStatus.OPEN), (None, LedgerStatus.MANUAL),
             (LedgerStatus.OPEN, LedgerStatus.OPEN), (LedgerStatus.OPEN, LedgerStatus.MANUAL),
             (LedgerStatus.MANUAL, LedgerStatus.OPEN), (LedgerStatus.MANUAL, LedgerStatus.MANUAL)}


@pytest.fixture
async def store(settings, scratch_db):
    engine = create_engine(settings, url=scratch_db.url)
    yield MySqlStore(engine, lock_retries=0)
    await engine.dispose()


def insert_row(db, status: LedgerStatus) -> int:
    """A row in ``status``; a retrying one is ``ME``'s, its claim run out (so another may take it)."""
    offset = next(_offsets)
    retrying = status is LedgerStatus.RETRYING
    db.query("INSERT INTO t_compensation (src_topic, src_partition, src_offset, consumer_group, status, reason, "
             "message, retriable, attempts, first_failure_at, owner, lease_until, gmt_create, gmt_modified) "
             "VALUES (%s, 0, %s, %s, %s, 'effect_unavailable', 'm', 1, 1, NOW(3), %s, "
             "NOW(3) - INTERVAL 1 SECOND, NOW(3), NOW(3))",
             TOPIC, offset, GROUP, int(status), ME if retrying else None)
    return db.scalar("SELECT id FROM t_compensation WHERE src_topic = %s AND src_offset = %s", TOPIC, offset)


async def claim(execute, row_id: int, to: LedgerStatus) -> None:
    if to is LedgerStatus.RETRYING:
        await ledger.claim(execute, row_id, OTHER, 30, EVERY)


async def claim_many(execute, row_id: int, to: LedgerStatus) -> None:
    if to is LedgerStatus.RETRYING:
        await ledger.claim_many(execute, [row_id], OTHER, 30, group=GROUP, allowed=EVERY)


async def settle(execute, row_id: int, to: LedgerStatus) -> None:
    try:
        await ledger.settle(execute, row_id, ME, to, redrives=1, retry_in=None, message="redriven", reason=None)
    except ValueError as exc:            # a target the table forbids from retrying: refused before any SQL
        assert not ledger_move_allowed(LedgerStatus.RETRYING, to), exc


async def move(execute, row_id: int, to: LedgerStatus) -> None:
    await ledger.move(execute, row_id, to, EVERY)


WRITES = [claim, claim_many, settle, move]


async def test_every_write_moves_a_ledger_row_only_as_its_state_machine_allows(store, scratch_db):
    made = set()
    for src, dst, write in itertools.product(LedgerStatus, LedgerStatus, WRITES):
        row_id = insert_row(scratch_db, src)
        before = scratch_db.query("SELECT status, owner FROM t_compensation WHERE id = %s", row_id)[0]
        async with store.engine.connect() as conn:
            await write(MySqlTransaction(conn, store)._exec, row_id, dst)
            await conn.commit()
        after = scratch_db.query("SELECT status, owner FROM t_compensation WHERE id = %s", row_id)[0]
        if after == before:
            continue
        moved = (src, LedgerStatus(after["status"]))
        assert moved == (src, dst), f"{write.__name__} asked for {src.name} -> {dst.name} made {moved[1].name}"
        assert ledger_move_allowed(src, dst), f"{write.__name__} moved a {src.name} row to {dst.name}"
        made.add(moved)
    assert LEDGER_TRANSITIONS - BY_RECORD - made == set(), "moves the table allows that no write makes"
