"""The operator controls in the database (``t_effect_hold``, ``t_partition_pause``, ``t_control_audit``):
what every worker reads every few seconds, and a person's hold, release, pause and resume, each
audited in the same transaction. What they mean is ``app.pipeline.controls``'s.

The database's clock decides whether a hold has begun or ended (``NOW(3)``, read with the rows), so
every worker agrees whatever its own clock says.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from app.pipeline.controls import Hold, Pause

if TYPE_CHECKING:
    from app.adapters.mysql.store import MySqlStore

TEXT = 1024                 # reason and note columns
ACTOR = 128
HOLD_COLUMNS = ("id", "effect", "starts_at", "ends_at", "auto_release", "reason", "held_by")
# Whether a hold is in force, and by how much one a person must end is past its planned end: by the
# database's clock.
ACTIVE = "(starts_at <= NOW(3) AND (auto_release = 0 OR ends_at > NOW(3)))"
OVERDUE = "IF(auto_release = 0 AND ends_at < NOW(3), TIMESTAMPDIFF(MICROSECOND, ends_at, NOW(3)) / 1e6, 0)"
PAUSE_COLUMNS = ("id", "topic", "partition_no", "reason", "paused_by", "paused_at")
RECENT = 50                 # ended holds and pauses a listing shows


class ControlRefused(ValueError):
    """A hold, release, pause or resume that cannot be done as asked (the message says why)."""


@dataclass(frozen=True, slots=True)
class Ended:
    """A hold released or a pause resumed, for a listing: when, by whom, with which note."""

    kind: str                   # hold or pause
    id: int
    target: str                 # the effect, or topic:partition
    reason: str
    by: str
    began_at: datetime
    ended_at: datetime | None
    ended_by: str | None
    note: str | None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class MySqlControls:
    def __init__(self, store: MySqlStore, *, group: str) -> None:
        self.store = store
        self.group = group[:255]

    async def in_force(self) -> tuple[list[Hold], list[Pause]]:
        """The holds not released (in force, or to begin) and the pauses not resumed: what a worker
        reads every few seconds (``idx_group_released``, ``idx_group_resumed``)."""
        async def work(tx) -> tuple[list[Hold], list[Pause]]:
            holds = await tx._exec(
                f"SELECT {', '.join(HOLD_COLUMNS)}, {ACTIVE}, {OVERDUE} FROM t_effect_hold "
                "WHERE consumer_group = %s AND released_at IS NULL AND (auto_release = 0 OR ends_at > NOW(3)) "
                "ORDER BY starts_at, id", [self.group])
            pauses = await tx._exec(
                f"SELECT {', '.join(PAUSE_COLUMNS)} FROM t_partition_pause "
                "WHERE consumer_group = %s AND resumed_at IS NULL ORDER BY topic, partition_no, id", [self.group])
            return [_hold(row) for row in holds], [_pause(row) for row in pauses]
        return await self.store.in_transaction(work)

    async def hold(self, effect: str, *, reason: str, actor: str, starts_in: float, lasts: float,
                   auto_release: bool) -> Hold:
        """Hold ``effect`` from ``starts_in`` seconds from now for ``lasts`` seconds (its planned end);
        ``auto_release``: it ends then by itself, else when a person ends it."""
        if not reason.strip():
            raise ControlRefused("a hold needs a reason: what people will read while it lasts")
        if starts_in < 0 or lasts <= 0:
            raise ControlRefused("a hold begins now or later, and lasts a while")

        async def work(tx) -> Hold:
            result = await tx._exec(
                "INSERT INTO t_effect_hold (consumer_group, effect, starts_at, ends_at, auto_release, reason, held_by) "
                "VALUES (%s, %s, NOW(3) + INTERVAL %s MICROSECOND, NOW(3) + INTERVAL %s MICROSECOND, %s, %s, %s)",
                [self.group, effect[:32], int(starts_in * 1e6), int((starts_in + lasts) * 1e6), int(auto_release),
                 reason[:TEXT], actor[:ACTOR]])
            hold_id = int(result.lastrowid)
            await _audit(tx, self.group, actor, "hold", effect, hold_id, reason)
            return (await _holds(tx, self.group, f"id = {hold_id}"))[0]
        return await self.store.in_transaction(work)

    async def release(self, *, actor: str, note: str, hold_id: int | None = None,
                      effect: str | None = None) -> list[Hold]:
        """End hold ``hold_id``, or every hold of ``effect`` not released (those to come too); the holds
        ended (none: nothing was held)."""
        if not note.strip():
            raise ControlRefused("ending a hold needs a note: what changed")
        where = f"id = {int(hold_id)}" if hold_id is not None else None
        if where is None and effect is None:
            raise ControlRefused("name the hold (its id) or the effect")

        async def work(tx) -> list[Hold]:
            found = await _holds(tx, self.group, where or "effect = %s", [] if where else [effect], lock=True,
                                 unreleased=True)
            if not found:
                return []
            ids = ", ".join(str(hold.id) for hold in found)
            await tx._exec("UPDATE t_effect_hold SET released_at = NOW(3), released_by = %s, release_note = %s "
                           f"WHERE id IN ({ids})", [actor[:ACTOR], note[:TEXT]])
            for hold in found:
                await _audit(tx, self.group, actor, "release", hold.effect, hold.id, note)
            return found
        return await self.store.in_transaction(work)

    async def pause(self, topic: str, partition: int, *, reason: str, actor: str) -> tuple[Pause, bool]:
        """Pause ``topic``'s ``partition``; the pause, and whether it is new (a partition paused already
        stays as it was)."""
        if not reason.strip():
            raise ControlRefused("a pause needs a reason: what people will read while it lasts")

        async def work(tx) -> tuple[Pause, bool]:
            found = await _pauses(tx, self.group, topic, partition, lock=True)
            if found:
                return found[0], False
            result = await tx._exec(
                "INSERT INTO t_partition_pause (consumer_group, topic, partition_no, reason, paused_by) "
                "VALUES (%s, %s, %s, %s, %s)", [self.group, topic[:249], int(partition), reason[:TEXT], actor[:ACTOR]])
            pause_id = int(result.lastrowid)
            await _audit(tx, self.group, actor, "pause", f"{topic}:{partition}", pause_id, reason)
            return (await _pauses(tx, self.group, topic, partition))[0], True
        return await self.store.in_transaction(work)

    async def resume(self, topic: str, partition: int, *, actor: str, note: str) -> Pause | None:
        """Resume ``topic``'s ``partition``; the pause ended (None: it was not paused)."""
        if not note.strip():
            raise ControlRefused("resuming needs a note: what was found")

        async def work(tx) -> Pause | None:
            found = await _pauses(tx, self.group, topic, partition, lock=True)
            if not found:
                return None
            await tx._exec("UPDATE t_partition_pause SET resumed_at = NOW(3), resumed_by = %s, resume_note = %s "
                           f"WHERE id = {found[0].id}", [actor[:ACTOR], note[:TEXT]])
            await _audit(tx, self.group, actor, "resume", f"{topic}:{partition}", found[0].id, note)
            return found[0]
        return await self.store.in_transaction(work)

    async def ended(self, limit: int = RECENT) -> list[Ended]:
        """The holds released (or run out) and the pauses resumed lately, newest first."""
        async def work(tx) -> list[Ended]:
            holds = await tx._exec(
                "SELECT id, effect, reason, held_by, starts_at, COALESCE(released_at, ends_at), released_by, "
                "release_note FROM t_effect_hold WHERE consumer_group = %s AND (released_at IS NOT NULL "
                "OR (auto_release = 1 AND ends_at <= NOW(3))) ORDER BY id DESC LIMIT %s", [self.group, limit])
            pauses = await tx._exec(
                "SELECT id, CONCAT(topic, ':', partition_no), reason, paused_by, paused_at, resumed_at, resumed_by, "
                "resume_note FROM t_partition_pause WHERE consumer_group = %s AND resumed_at IS NOT NULL "
                "ORDER BY id DESC LIMIT %s", [self.group, limit])
            found = [Ended("hold", *row) for row in holds] + [Ended("pause", *row) for row in pauses]
            return sorted(found, key=lambda e: e.ended_at or e.began_at, reverse=True)[:limit]
        return await self.store.in_transaction(work)

    async def audit(self, limit: int = RECENT) -> list[dict[str, Any]]:
        """Who did what to the controls, newest first."""
        async def work(tx) -> list[dict[str, Any]]:
            result = await tx._exec("SELECT at, actor, action, target, control_id, note FROM t_control_audit "
                                    "WHERE consumer_group = %s ORDER BY id DESC LIMIT %s", [self.group, limit])
            return [dict(zip(("at", "actor", "action", "target", "control_id", "note"), row, strict=True))
                    for row in result]
        return await self.store.in_transaction(work)


async def _holds(tx, group: str, where: str, params: list | None = None, *, lock: bool = False,
                 unreleased: bool = False) -> list[Hold]:
    result = await tx._exec(
        f"SELECT {', '.join(HOLD_COLUMNS)}, {ACTIVE}, {OVERDUE} FROM t_effect_hold WHERE consumer_group = %s "
        f"AND {where}" + (" AND released_at IS NULL" if unreleased else "") + (" FOR UPDATE" if lock else ""),
        [group, *(params or [])])
    return [_hold(row) for row in result]


async def _pauses(tx, group: str, topic: str, partition: int, *, lock: bool = False) -> list[Pause]:
    result = await tx._exec(
        f"SELECT {', '.join(PAUSE_COLUMNS)} FROM t_partition_pause WHERE consumer_group = %s AND resumed_at IS NULL "
        "AND topic = %s AND partition_no = %s ORDER BY id" + (" FOR UPDATE" if lock else ""),
        [group, topic, int(partition)])
    return [_pause(row) for row in result]


async def _audit(tx, group: str, actor: str, action: str, target: str, control_id: int, note: str | None) -> None:
    await tx._exec("INSERT INTO t_control_audit (consumer_group, at, actor, action, target, control_id, note) "
                   "VALUES (%s, NOW(3), %s, %s, %s, %s, %s)",
                   [group, actor[:ACTOR], action, target[:300], control_id, None if note is None else note[:TEXT]])


def _hold(row) -> Hold:
    hold_id, effect, starts, ends, auto, reason, held_by, active, overdue = row
    return Hold(int(hold_id), effect, starts, ends, bool(auto), reason, held_by, bool(active), float(overdue or 0))


def _pause(row) -> Pause:
    pause_id, topic, partition, reason, paused_by, paused_at = row
    return Pause(int(pause_id), topic, int(partition), reason, paused_by, paused_at)
