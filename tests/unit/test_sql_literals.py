"""The statement builder: inlined values are safe, everything else is a parameter."""

from datetime import date

from app.adapters.mysql.sql import Sql


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
