"""The growth bench's pre-fill (``bench/growth/prefill.py``) writes what it says: done rows whose keys
the app would write, spread over the past year as ``rows_by_day`` counts them, in the month
partitions of their dates. The bench's byte and drop figures rest on it."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from app.pipeline.events import part_date_of
from bench import growth
from harness.services import ScratchDatabase


@pytest.fixture()
def growth_db(settings):
    db = ScratchDatabase(settings.database.url).create()
    yield db
    db.drop()


def test_the_prefill_writes_done_rows_of_the_past_year_as_counted(growth_db):
    today = datetime.now(UTC).date()
    total = 4_003                                          # not a multiple of an order's four rows
    assert growth.sequence_engine(growth_db.url)
    done = growth.prefill(growth_db.url, total, today, chunk=1_000)
    assert done["rows"] == total
    by_day = {row["part_date"]: row["n"] for row in growth_db.query(
        "SELECT part_date, COUNT(*) AS n FROM t_idem WHERE status = 2 GROUP BY part_date")}
    assert by_day == growth.rows_by_day(total, today)
    assert min(by_day) >= date.fromordinal(today.toordinal() - 365) and max(by_day) < today
    keys = growth_db.query("SELECT biz_key, part_date, step FROM t_idem ORDER BY biz_key LIMIT 50")
    for row in keys:
        order_no, _, step = row["biz_key"].split(":")
        assert part_date_of(order_no) == row["part_date"] and step == row["step"]
    tokens = growth_db.query("SELECT COUNT(*) AS n FROM t_idem WHERE step = 'issue_waybill' AND idem_token IS NULL")
    assert tokens[0]["n"] == 0
    size = growth.table_size(growth_db.url, exact_rows=total)
    assert size["rows"] == total and size["bytes"] > 0 and size["partitions"] >= 14
