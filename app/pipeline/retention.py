"""How long the dedup store remembers, and what follows from it.

``t_idem`` keeps an order's rows in the monthly partition of the date inside its
number, and partitions wholly older than the retention are dropped. An event of an
order dated before the retention's cutoff may have lost its rows: running it could
do again what was done once, so it is refused (``beyond_dedup_retention``) and never
run automatically. Partitions are only dropped a day after the cutoff has passed them.

Months are kept ready ``ahead`` months after the current one; an order dated after the
last of them is no real order date (``ORD-20991231-...``) and would land in the catch-all
partition, which every monthly split then copies while writes wait: it is refused as
malformed (``latest``).

"Today" is the database's (``app.adapters.mysql.clock``): the worker that drops a
partition and the worker that refuses an event agree on the date whatever their own
clocks say.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from app.pipeline.errors import BeyondDedupRetention


def utc_today() -> date:
    return datetime.now(UTC).date()


@dataclass(frozen=True)
class Retention:
    days: int
    today: Callable[[], date] = field(default=utc_today, compare=False)
    ahead: int = 3              # months kept ready after the current one (PARTITIONS_AHEAD)

    def cutoff(self) -> date:
        """Orders dated before this are refused."""
        return self.today() - timedelta(days=self.days)

    def latest(self) -> date:
        """The last order date accepted: the end of the last month kept ready."""
        today = self.today()
        index = today.year * 12 + today.month - 1 + self.ahead + 1      # the month after the last one ready
        return date(index // 12, index % 12 + 1, 1) - timedelta(days=1)

    def drop_before(self) -> date:
        """A partition may be dropped when every date it can hold is before this (a day before the cutoff)."""
        return self.cutoff() - timedelta(days=1)

    def refusal(self, order_no: str, part_date: date) -> BeyondDedupRetention | None:
        cutoff = self.cutoff()
        if part_date >= cutoff:
            return None
        return BeyondDedupRetention(
            f"order {order_no} is dated {part_date.isoformat()}, before the dedup store's retention "
            f"(IDEM_RETENTION_DAYS={self.days}, cutoff {cutoff.isoformat()}): its t_idem rows may be gone, so the "
            "event is not run again; reconcile it by hand")
