"""``t_skipped_type``: what each consumer group skipped of the types it does not handle, by type.

Every worker adds its counts at its gauges' refresh, one upsert for all of its types (``VALUES()``
in ``ON DUPLICATE KEY UPDATE``: MariaDB's form, which MySQL 8 still takes, with a deprecation
warning since 8.0.20); a person reads them on the console.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from app.adapters.mysql.sql import marks
from app.adapters.mysql.store import MySqlStore

Taken = Mapping[str, tuple[int, tuple[str, int, int] | None]]


class SkippedTypes:
    def __init__(self, store: MySqlStore, *, group: str) -> None:
        self.store = store
        self.group = group

    async def add(self, taken: Taken) -> None:
        if not taken:
            return
        params: list[Any] = []
        for name, (count, where) in sorted(taken.items()):
            topic, partition, offset = where or (None, None, None)
            params += [self.group[:255], name[:64], count, topic, partition, offset]
        sql = ("INSERT INTO t_skipped_type (consumer_group, event_type, skipped, first_seen, last_seen, last_topic, "
               f"last_partition, last_offset) VALUES {marks(len(taken), '(%s, %s, %s, NOW(3), NOW(3), %s, %s, %s)')} "
               "ON DUPLICATE KEY UPDATE skipped = skipped + VALUES(skipped), last_seen = VALUES(last_seen), "
               "last_topic = COALESCE(VALUES(last_topic), last_topic), "
               "last_partition = COALESCE(VALUES(last_partition), last_partition), "
               "last_offset = COALESCE(VALUES(last_offset), last_offset)")
        await self.store.in_transaction(lambda tx: tx._exec(sql, params))

    async def census(self, *, declared: Collection[str], new_within_seconds: float) -> tuple[int, int]:
        """How many types this group skipped, and how many of those it skipped for the first time
        within ``new_within_seconds`` that are not ``declared`` (``FOREIGN_EVENT_TYPES``): the gauges
        ``order_skipped_types`` and ``order_skipped_types_new``, by the database's clock."""
        names = sorted(declared)
        spared = f"AND event_type NOT IN ({marks(len(names))}) " if names else ""
        async def work(tx):
            result = await tx._exec(
                f"SELECT COUNT(*), COALESCE(SUM(first_seen >= NOW(3) - INTERVAL %s MICROSECOND {spared}), 0) "
                "FROM t_skipped_type WHERE consumer_group = %s",
                [int(new_within_seconds * 1_000_000), *names, self.group[:255]])
            return next(iter(result))
        total, new = await self.store.in_transaction(work)
        return int(total), int(new)

    async def list(self) -> list[dict[str, Any]]:
        """Every type this group skipped, the most skipped first (at most 200: bounded by the
        100 names a worker keeps, and ``other``)."""
        async def work(tx):
            result = await tx._exec(
                "SELECT event_type, skipped, first_seen, last_seen, last_topic, last_partition, last_offset "
                "FROM t_skipped_type WHERE consumer_group = %s ORDER BY skipped DESC, event_type LIMIT 200",
                [self.group[:255]])
            return [dict(zip(("event_type", "skipped", "first_seen", "last_seen", "topic", "partition", "offset"),
                             row, strict=True)) for row in result]
        return await self.store.in_transaction(work)
