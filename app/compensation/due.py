"""The rows whose retry is due, drained a batch at a time (``app.timers.compensation``, on every
worker): one claim for a batch of rows (rows another worker is claiming are skipped, not waited
for), their events through the pipeline at once (``app.compensation.redrive``), one settle. Between
drains the timer sleeps until the next row comes due; a dead letter that arrives not due yet
(``app.compensation.dead_letters``) wakes it to look again.
"""

from __future__ import annotations

import asyncio
import logging
import time

from app.compensation.redrive import Redriver

log = logging.getLogger(__name__)


class DueRows:
    def __init__(self, redriver: Redriver) -> None:
        self.redriver = redriver
        self.ledger = redriver.ledger
        self.group = redriver.group
        self.lease_seconds = redriver.lease_seconds
        # Set when a dead letter arrives that is not due yet: the drain, asleep until the next due
        # row it knew of, looks again when this one comes due (``sleep_until_due``).
        self._new_letter = asyncio.Event()

    def wake(self) -> None:
        """A dead letter arrived that is not due yet: look again when the next row comes due."""
        self._new_letter.set()

    async def drain(self, guard, *, seconds: float, batch_size: int, actor: str = "timer") -> int:
        """Due rows, ``batch_size`` at a time, until none is due or ``seconds`` have passed."""
        started, ran = time.monotonic(), 0
        while time.monotonic() - started < seconds:
            done = await self.run_due(batch_size, guard, actor=actor)
            ran += done
            if not done:
                break
        return ran

    async def next_due(self, guard) -> float | None:
        """Seconds until a row of this group comes due (``Ledger.next_due``)."""
        return await guard(lambda: self.ledger.next_due(self.group))

    async def sleep_until_due(self, guard, longest: float) -> None:
        """Until the next row comes due, at most ``longest``; a dead letter that arrives meanwhile
        (the dead-letter agent) makes it look again. At least half a second: rows due now that
        could not be claimed are another worker's right now."""
        while True:
            self._new_letter.clear()
            try:
                due = await self.next_due(guard)
            except Exception as exc:
                log.warning("when the next dead letter comes due could not be read: %r", exc)
                due = None
            wait = longest if due is None else min(longest, max(due + 0.05, 0.5))
            try:
                await asyncio.wait_for(self._new_letter.wait(), wait)
            except TimeoutError:
                return

    async def run_due(self, limit: int, guard, *, actor: str = "timer") -> int:
        """This consumer group's rows whose retry is due, at most ``limit``, as one batch: one
        claim for all of them (rows another worker is claiming are skipped, not waited for),
        their events through the pipeline at once, one settle."""
        owner = self.redriver.owner()
        rows = await guard(lambda: self.ledger.claim_due(self.group, limit, owner, self.lease_seconds))
        if not rows:
            return 0
        settlements = await self.redriver.redrive(rows, guard, owner)
        settled = await guard(lambda: self.ledger.settle(settlements, owner=owner, actor=actor, action="redrive"))
        for s in settlements:
            if s.row_id not in settled:
                log.warning("ledger row %s: its claim ran out before the redrive ended; another claim decides", s.row_id)
            else:
                log.info("ledger row %s: -> %s: %s", s.row_id, s.verdict.status.name, s.verdict.detail[:300])
        return len(rows)
