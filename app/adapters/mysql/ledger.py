"""Statements on ``t_compensation``, the ledger of dead letters."""

from __future__ import annotations

from typing import Sequence

from app.adapters.mysql import orders
from app.adapters.mysql.sql import Execute, Sql
from app.pipeline.ports import DeadLetter


async def record(execute: Execute, letters: Sequence[DeadLetter], *, group: str, retry_after_seconds: int) -> None:
    """One row per letter, keyed by the consumer group and the record's source (topic,
    partition, offset and timestamp: a topic deleted and created again reuses offsets,
    not timestamps): writing the same letter again (a replay after a crash) leaves the
    first row as it is. The letters' orders are marked ``has_dead_letters``: their next
    move, in a later batch, flags these rows ``may_be_superseded``."""
    params: list = []
    values = []
    due = f"NOW(3) + INTERVAL {int(retry_after_seconds)} SECOND"
    for letter in letters:
        source = letter.record
        values.append(f"(%s, %s, %s, %s, %s, %s, %s, %s, 1, %s, %s, %s, %s, {due if letter.retriable else 'NULL'}, "
                      "%s, %s, %s, %s, NOW(3), NOW(3))")
        params += [source.topic, source.partition, source.offset,
                   -1 if source.timestamp_ms is None else source.timestamp_ms, group, letter.order_no,
                   letter.event_id, letter.biz_key, letter.reason[:64], letter.message[:1024], letter.retriable,
                   letter.attempts, letter.may_be_superseded, letter.truncated, letter.worker_id,
                   letter.first_failure_at.replace(tzinfo=None)]
    await execute(
        "INSERT INTO t_compensation (src_topic, src_partition, src_offset, src_timestamp, consumer_group, "
        "order_no, event_id, biz_key, status, reason, message, retriable, attempts, next_retry_at, "
        "may_be_superseded, truncated, worker_id, first_failure_at, gmt_create, gmt_modified) "
        f"VALUES {', '.join(values)} ON DUPLICATE KEY UPDATE src_offset = src_offset", params)
    order_nos = sorted({letter.order_no for letter in letters if letter.order_no})
    if order_nos:
        await orders.mark_dead_letters(execute, order_nos)


async def flag_overtaken(execute: Execute, order_nos: Sequence[str], batch_keys: Sequence[str]) -> None:
    """Dead letters of these orders now have later events that ran after them (but a letter
    is never overtaken by its own event, run again in this batch)."""
    sql = Sql()
    spare = f" AND (biz_key IS NULL OR biz_key NOT IN ({sql.list(batch_keys)}))" if batch_keys else ""
    await execute(
        "UPDATE t_compensation SET may_be_superseded = 1, gmt_modified = NOW(3) "
        f"WHERE order_no IN ({sql.list(order_nos)}) AND may_be_superseded = 0{spare}", sql.params)
