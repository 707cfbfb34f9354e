"""The statement builder: inlined values are safe, everything else is a parameter."""

import asyncio
from datetime import date

from app.adapters.mysql import idem
from app.adapters.mysql.sql import Sql
from app.pipeline.model import NewRow
from app.pipeline.states import IdemStatus


def test_safe_values_are_inlined_and_others_become_parameters():
    sql = Sql()
    text = sql.list(["ORD-20261129-A1:ORDER_PAID:mark_paid", date(2026, 11, 29), 7, True, None, "o'brien",
                     "a\\b", "50%", "x y", "12 Bench Road, 3/F", "naïve", "a\nb", "x'--"])
    assert text == ("'ORD-20261129-A1:ORDER_PAID:mark_paid', '2026-11-29', 7, 1, NULL, %s, %s, %s, 'x y', "
                    "'12 Bench Road, 3/F', %s, %s, %s")
    assert sql.params == ["o'brien", "a\\b", "50%", "naïve", "a\nb", "x'--"]


def test_each_use_of_an_unsafe_value_adds_its_own_parameter():
    sql = Sql()
    assert f"{sql.lit('a%b')}, {sql.lit('a%b')}" == "%s, %s"
    assert sql.params == ["a%b", "a%b"]


def test_a_t_idem_insert_puts_each_parameter_in_its_place():
    statements = []

    async def keep(text, params):
        statements.append((text, params))

    rows = [NewRow("k'1", date(2026, 12, 3), "create_order", IdemStatus.DONE, "h1", outcome="applied"),
            NewRow("k2", date(2026, 12, 3), "issue_waybill", IdemStatus.PENDING, "h2", idem_token="t'2")]
    for owner, shown in [("o'wner", '"o\'wner"'), ("worker-1/7", "'worker-1/7'")]:
        statements.clear()
        asyncio.run(idem.insert(keep, rows, owner=owner, lease_us=1000))
        [(text, params)] = statements
        values = (text % tuple(repr(p) for p in params)).split(" VALUES ", 1)[1]
        assert values == (
            f"(\"k'1\", '2026-12-03', 'create_order', 2, 1, {shown}, NULL, NULL, 'h1', 'applied', NOW(3), NOW(3), "
            f"NULL), ('k2', '2026-12-03', 'issue_waybill', 1, 1, {shown}, NOW(3) + INTERVAL 1000 MICROSECOND, \"t'2\", "
            "'h2', NULL, NOW(3), NOW(3), NOW(3))")             # a pending row's first call may start now
