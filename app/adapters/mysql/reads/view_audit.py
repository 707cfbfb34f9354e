"""The audit of unmasked views (``t_view_audit``): one row each time a person sees personal data
whole, written before the answer leaves, so a view the database cannot record is not served."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.adapters.mysql.store import MySqlStore

PATH_CHARS = 512            # t_view_audit.path


@dataclass(frozen=True, slots=True)
class Seen:
    """One unmasked view: who (``web:<name>``, ``cli:<name>``), as what role, what, and which
    dead letter or order."""

    actor: str
    role: str
    what: str
    path: str
    compensation_id: int | None = None
    order_no: str | None = None


class ViewAudit:
    """This consumer group's audit of unmasked views (apps sharing a database keep theirs apart)."""

    def __init__(self, store: MySqlStore, *, group: str) -> None:
        self.store = store
        self.group = group

    async def record(self, seen: Seen) -> None:
        async def work(tx) -> None:
            await tx._exec("INSERT INTO t_view_audit (at, consumer_group, actor, role, what, path, compensation_id, "
                           "order_no) VALUES (NOW(3), %s, %s, %s, %s, %s, %s, %s)",
                           [self.group, seen.actor[:128], seen.role, seen.what, seen.path[:PATH_CHARS],
                            seen.compensation_id, seen.order_no])
        await self.store.in_transaction(work)

    async def recent(self, *, limit: int, before_id: int | None = None) -> list[dict[str, Any]]:
        """Newest first, at most ``limit``; the next page with ``before_id`` (``idx_group_id``)."""
        where, params = "consumer_group = %s", [self.group]
        if before_id is not None:
            where += " AND id < %s"
            params.append(before_id)

        async def work(tx) -> list[dict[str, Any]]:
            result = await tx._exec(f"SELECT id, at, actor, role, what, path, compensation_id, order_no "
                                    f"FROM t_view_audit WHERE {where} ORDER BY id DESC LIMIT {int(limit)}", params)
            keys = list(result.keys())
            return [dict(zip(keys, row)) for row in result]
        return await self.store.in_transaction(work)
