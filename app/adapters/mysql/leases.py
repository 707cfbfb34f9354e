"""Named leases in ``t_lease``: one holder at a time for a timer's work.

``@app.timer(on_leader=True)`` only checks, once per tick, whether this worker holds
partition 0 of the leader topic: two workers can both run a tick around a rebalance.
A row with an owner and an expiry, taken in one statement and read back, is mutual
exclusion; a holder that died lets it expire.
"""

from __future__ import annotations

import hashlib

from app.adapters.mysql.store import MySqlStore

NAME_LENGTH = 64        # t_lease.name


def lease_name(work: str, group: str) -> str:
    """The lease of ``work`` for one consumer group (groups sharing a database each run their own);
    a name too long for the column keeps a hash of the group instead of its tail."""
    name = f"{work}:{group}"
    if len(name) <= NAME_LENGTH:
        return name
    digest = hashlib.sha256(group.encode()).hexdigest()[:12]
    return f"{name[:NAME_LENGTH - 13]}~{digest}"


class MySqlLeases:
    def __init__(self, store: MySqlStore) -> None:
        self.store = store

    async def acquire(self, name: str, owner: str, seconds: float) -> bool:
        """Take (or renew) the lease ``name`` for ``seconds`` unless somebody else holds it."""
        lease_us = int(seconds * 1_000_000)

        async def work(tx) -> bool:
            # Both assignments move under the same condition, read so that it holds whichever
            # way the server assigns: left to right, each seeing the ones before it (MySQL, and
            # MariaDB's default), or all from the row as it was (MariaDB's SIMULTANEOUS_ASSIGNMENT).
            # ``lease_until`` still reads its old value either way; ``owner = VALUES(owner)`` read
            # after ``owner`` moved is true when it moved to us or was ours already, as before.
            taken = "lease_until < NOW(3) OR owner = VALUES(owner)"
            await tx._exec(
                "INSERT INTO t_lease (name, owner, lease_until, gmt_modified) "
                f"VALUES (%s, %s, NOW(3) + INTERVAL {lease_us} MICROSECOND, NOW(3)) ON DUPLICATE KEY UPDATE "
                f"owner = IF({taken}, VALUES(owner), owner), "
                f"lease_until = IF({taken}, VALUES(lease_until), lease_until), "
                "gmt_modified = NOW(3)", [name, owner])
            result = await tx._exec("SELECT owner FROM t_lease WHERE name = %s", [name])
            return result.scalar() == owner

        return await self.store.in_transaction(work)

    async def release(self, name: str, owner: str) -> None:
        await self.store.in_transaction(lambda tx: tx._exec(
            "UPDATE t_lease SET lease_until = NOW(3) WHERE name = %s AND owner = %s", [name, owner]))
