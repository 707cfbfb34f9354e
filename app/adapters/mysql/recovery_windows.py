"""The recovery windows as the CLI, the gauges and the watermark see them: opening, ending and
listing windows, the store's recorded server and advancing its watermark, each in a transaction
of its own. What a window means, and the statements run inside the pipeline's transactions, are
``app.adapters.mysql.recovery``'s."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from app.adapters.mysql.recovery import REASON_CHARS, Advanced, advance, open_age, open_sql

if TYPE_CHECKING:
    from app.adapters.mysql.store import MySqlStore


@dataclass(frozen=True, slots=True)
class Window:
    id: int
    opened_at: datetime
    ends_at: datetime
    opened_by: str
    reason: str
    ended_at: datetime | None
    ended_by: str | None
    end_note: str | None
    open: bool

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class RecoveryWindows:
    """The windows, for the CLI, the gauges and the tests."""

    def __init__(self, store: MySqlStore) -> None:
        self.store = store

    async def start(self, *, hours: float, actor: str, note: str) -> Window:
        if not 0 < hours <= 24 * 90:
            raise ValueError("a recovery window lasts more than 0 and at most 2160 hours (90 days)")

        async def work(tx) -> Window:
            result = await tx._exec(open_sql(hours),
                                    [actor[:128], note[:REASON_CHARS]])
            return (await self._select(tx, f"WHERE id = {int(result.lastrowid)}"))[0]

        return await self.store.in_transaction(work)

    async def end(self, *, actor: str, note: str) -> list[Window]:
        """End every open window now; the windows ended."""
        async def work(tx) -> list[Window]:
            ending = await self._select(tx, "WHERE ends_at > NOW(3) AND ended_at IS NULL", lock=True)
            if not ending:
                return []
            ids = ", ".join(str(w.id) for w in ending)
            await tx._exec("UPDATE t_recovery_window SET ended_at = NOW(3), ended_by = %s, end_note = %s "
                           f"WHERE id IN ({ids})", [actor[:128], note[:REASON_CHARS]])
            return await self._select(tx, f"WHERE id IN ({ids})")

        return await self.store.in_transaction(work)

    async def recent(self, limit: int = 20) -> list[Window]:
        return await self.store.in_transaction(lambda tx: self._select(tx, f"ORDER BY id DESC LIMIT {int(limit)}"))

    async def open_age(self) -> float | None:
        return await self.store.in_transaction(lambda tx: open_age(tx._exec))

    async def server(self) -> tuple[str, int] | None:
        """The server the store last recorded, and its watermark."""
        async def work(tx) -> tuple[str, int] | None:
            found = (await tx._exec("SELECT server, watermark FROM t_store_server WHERE id = 1", ())).first()
            return None if found is None else (found[0], int(found[1]))

        return await self.store.in_transaction(work)

    async def advance(self, *, remembered: int, worker_id: str, hours: float) -> Advanced:
        return await self.store.in_transaction(
            lambda tx: advance(tx._exec, remembered=remembered, worker_id=worker_id, hours=hours))

    @staticmethod
    async def _select(tx, where: str, *, lock: bool = False) -> list[Window]:
        result = await tx._exec(
            "SELECT id, opened_at, ends_at, opened_by, reason, ended_at, ended_by, end_note, "
            f"(ends_at > NOW(3) AND ended_at IS NULL) FROM t_recovery_window {where}"
            f"{' FOR UPDATE' if lock else ''}", ())
        return [Window(*row[:8], open=bool(row[8])) for row in result]
