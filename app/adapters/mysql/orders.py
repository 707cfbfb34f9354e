"""Statements on ``t_order``. An order's rank only goes up, in SQL too."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from app.adapters.mysql.sql import Execute, Sql, marks
from app.pipeline.states import ORDER_DATA, Order, OrderStatus

_COLUMNS = ", ".join(ORDER_DATA)
_STATUS = {status: str(int(status)) for status in OrderStatus}
_data = attrgetter(*ORDER_DATA)
_data_of = _data if len(ORDER_DATA) > 1 else (lambda order: (_data(order),))     # always a tuple


async def read(execute: Execute, order_nos: Sequence[str]) -> dict[str, Order]:
    """The orders, locked."""
    if not order_nos:
        return {}
    sql = Sql()
    result = await execute(
        f"SELECT order_no, status, {_COLUMNS}, has_dead_letters FROM t_order "
        f"WHERE order_no IN ({sql.list(order_nos)}) FOR UPDATE", sql.params)
    width = len(ORDER_DATA)
    return {row[0]: Order(row[0], OrderStatus(row[1]), *row[2:2 + width], has_dead_letters=bool(row[2 + width]))
            for row in result}


async def upsert(execute: Execute, orders: Sequence[Order]) -> None:
    """Insert new orders, move existing ones forward (never back).

    ``INSERT ... ON DUPLICATE KEY UPDATE`` assignments run left to right and each
    sees the columns already updated: every column whose condition reads
    ``status`` comes before ``status``. A move takes the new data (what the
    local step set; the rest is what was read) and clears ``has_dead_letters``:
    the letters it stood for were flagged in the same T1. A row that does not move
    only has its empty fields filled (a stale step's facts, such as a late payment)."""
    sql = Sql()
    lit = sql.lit
    values = ", ".join([f"({lit(o.order_no)}, {_STATUS[o.status]}, {', '.join([lit(v) for v in _data_of(o)])}, "
                        "NOW(3), NOW(3))" for o in orders])
    moved = "VALUES(status) > status"
    data = ", ".join(f"{name} = IF({moved}, COALESCE(VALUES({name}), {name}), COALESCE({name}, VALUES({name})))"
                     for name in ORDER_DATA)
    await execute(
        f"INSERT INTO t_order (order_no, status, {_COLUMNS}, gmt_create, gmt_modified) VALUES {values} "
        f"ON DUPLICATE KEY UPDATE {data}, "
        f"has_dead_letters = IF({moved}, 0, has_dead_letters), "
        f"gmt_modified = IF({moved}, NOW(3), gmt_modified), "
        f"status = IF({moved}, VALUES(status), status)", sql.params)


async def mark_dead_letters(execute: Execute, order_nos: Sequence[str]) -> None:
    """These orders have dead letters: their next move flags them as possibly overtaken."""
    await execute(f"UPDATE t_order SET has_dead_letters = 1 WHERE order_no IN ({marks(len(order_nos))})",
                  list(order_nos))
