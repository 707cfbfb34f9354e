"""Walking-skeleton store: records each event in t_idem (claim, then done)."""

from __future__ import annotations

from typing import Sequence

from sqlalchemy.ext.asyncio import AsyncEngine


class SkeletonStore:
    def __init__(self, engine: AsyncEngine, owner: str) -> None:
        self.engine = engine
        self.owner = owner

    async def record(self, keys: Sequence[str]) -> None:
        """Claim every key not seen before (pending), then mark this worker's claims done."""
        if not keys:
            return
        rows = ", ".join(["(%s, 1, 1, %s, NOW(3), NOW(3))"] * len(keys))
        params: list = []
        for key in keys:
            params += [key, self.owner]
        marks = ", ".join(["%s"] * len(keys))
        async with self.engine.begin() as conn:
            await conn.exec_driver_sql(
                "INSERT IGNORE INTO t_idem (biz_key, status, attempt, owner, gmt_create, gmt_modified) "
                f"VALUES {rows}", tuple(params))
            await conn.exec_driver_sql(
                f"UPDATE t_idem SET status = 2, gmt_modified = NOW(3) WHERE biz_key IN ({marks}) "
                "AND status = 1 AND owner = %s", (*keys, self.owner))
