"""Statements on ``t_worker``: every process's heartbeat, and what other claimants read of it: a claim whose
owner's process is dead is taken over at its presumed death (``app.pipeline.liveness_fence``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from app.adapters.mysql.sql import Execute, marks
from app.pipeline.liveness_fence import incarnation_of
from app.pipeline.model import IdemRow
from app.pipeline.states import IdemStatus, LedgerStatus

PENDING = int(IdemStatus.PENDING)
RETRYING = int(LedgerStatus.RETRYING)
KEPT_DAYS = 2          # a process's row after its last heartbeat: its claims' leases ended long before


async def beat(execute: Execute, incarnation: str, worker_id: str) -> None:
    await execute("INSERT INTO t_worker (incarnation, worker_id, started_at, last_seen) VALUES (%s, %s, NOW(3), NOW(3)) "
                  "ON DUPLICATE KEY UPDATE last_seen = NOW(3)", [incarnation[:160], worker_id[:64]])


async def live_members(execute: Execute, dead_after: float) -> int:
    """The processes beating now (not stopped, a heartbeat younger than ``dead_after``): the members
    a group-wide rate is shared among. A process of another kind that beats is counted too, which
    only makes each share smaller."""
    us = int(dead_after * 1_000_000)
    result = await execute(f"SELECT COUNT(*) FROM t_worker WHERE stopped_at IS NULL "
                           f"AND last_seen >= NOW(3) - INTERVAL {us} MICROSECOND", ())
    return int(next(iter(result))[0])


async def stopped(execute: Execute, incarnation: str) -> None:
    """A clean stop: it calls nothing more, so its claims are free at once."""
    await execute("UPDATE t_worker SET stopped_at = NOW(3), last_seen = NOW(3) WHERE incarnation = %s",
                  [incarnation[:160]])


async def prune(execute: Execute) -> None:
    await execute(f"DELETE FROM t_worker WHERE last_seen < NOW(3) - INTERVAL {KEPT_DAYS} DAY LIMIT 1000", ())


async def deaths(execute: Execute, incarnations: Sequence[str], dead_after: float) -> dict[str, datetime]:
    """Of ``incarnations``, the dead ones and when they died (presumed: their last heartbeat plus
    ``dead_after``; a clean stop: then). A process without a row (an older version, a test's) is
    not known dead: its leases run their course."""
    if not incarnations:
        return {}
    us = int(dead_after * 1_000_000)
    result = await execute(
        f"SELECT incarnation, COALESCE(stopped_at, last_seen + INTERVAL {us} MICROSECOND) FROM t_worker "
        f"WHERE incarnation IN ({marks(len(incarnations))}) "
        f"AND (stopped_at IS NOT NULL OR last_seen < NOW(3) - INTERVAL {us} MICROSECOND)", list(incarnations))
    return {row[0]: row[1] for row in result}


async def end_dead_leases(execute: Execute, held: Sequence[IdemRow], dead_after: float) -> list[str]:
    """The live leases of ``held`` whose owner is dead end at its death; the keys they were of."""
    by_owner: dict[str, list[str]] = {}
    for row in held:
        if row.owner and incarnation_of(row.owner):
            by_owner.setdefault(row.owner, []).append(row.biz_key)
    died = await deaths(execute, sorted({incarnation_of(owner) for owner in by_owner}), dead_after)
    taken: list[str] = []
    for owner, keys in by_owner.items():
        death = died.get(incarnation_of(owner))
        if death is None:
            continue
        await execute(f"UPDATE t_idem SET lease_until = %s WHERE biz_key IN ({marks(len(keys))}) "
                      f"AND status = {PENDING} AND owner = %s AND lease_until > %s", [death, *keys, owner, death])
        taken += keys
    return taken


async def end_dead_ledger_claims(execute: Execute, group: str, dead_after: float) -> int:
    """The ledger rows a dead compensator held (``retrying``) are free now: its claim ends at once
    (the steps' own claims are ended as above when the next redrive meets them)."""
    owners = [row[0] for row in await execute(
        f"SELECT DISTINCT owner FROM t_compensation WHERE status = {RETRYING} AND consumer_group = %s "
        "AND lease_until > NOW(3) LIMIT 200", [group])]
    incarnations = {owner: incarnation_of(owner) for owner in owners if incarnation_of(owner)}
    died = await deaths(execute, sorted(set(incarnations.values())), dead_after)
    dead = [owner for owner, incarnation in incarnations.items() if incarnation in died]
    if not dead:
        return 0
    result = await execute(
        f"UPDATE t_compensation SET lease_until = NOW(3) - INTERVAL 1000 MICROSECOND WHERE status = {RETRYING} "
        f"AND consumer_group = %s AND owner IN ({marks(len(dead))})", [group, *dead])
    return result.rowcount
