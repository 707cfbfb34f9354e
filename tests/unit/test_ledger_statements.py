"""The ledger's statements fill their placeholders in the order they appear."""

from __future__ import annotations

from app.adapters.mysql.ledger import statements as ledger


async def test_flag_overtaken_binds_its_parameters_in_text_order():
    """Values that cannot be written into the text become parameters; they were appended in the
    order the pieces were built (the batch keys first), not the order they appear in."""
    seen = []

    async def execute(sql, params):
        seen.append((sql, list(params)))

    await ledger.flag_overtaken(execute, ["ORD'1"], ["K'1", "K'2"])        # quotes: never inlined
    [(sql, params)] = seen
    assert sql.index("order_no IN") < sql.index("biz_key NOT IN") and sql.count("%s") == 3
    assert params == ["ORD'1", "K'1", "K'2"]
