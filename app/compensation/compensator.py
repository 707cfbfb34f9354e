"""The compensator: works the compensation ledger's rows (their rules: ``app.compensation.rules``)
by running their original events again through the same pipeline.

Where the work comes from, a module each, all standing on one redrive (``app.compensation.redrive``:
rows claimed, their events run again, what came of them settled):

* each record of the dead-letter topic (the dead-letter agent, in batches of at most 10):
  ``app.compensation.dead_letters``;
* the rows whose retry is due (the timer drains them, a batch at a time, as fast as the services
  answer): ``app.compensation.due``;
* a person's retry, resolve or discard from the console or the CLI, and a bulk job's chunk of
  them: ``app.compensation.person``.

:class:`Compensator` is the one object the agents, timers, views and commands are handed: it
builds the four on one processor and one ledger, and answers for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.compensation.bulk import ItemOutcome
from app.compensation.dead_letters import DeadLetters
from app.compensation.due import DueRows
from app.compensation.person import PersonActions
from app.compensation.redrive import Redriver
from app.compensation.rules import Backoff
from app.pipeline.envelopes import Reading
from app.pipeline.events import NATIVE
from app.pipeline.model import ActionResult, LedgerRow
from app.pipeline.ports import Ledger, SourceRecord
from app.pipeline.processor import Processor
from app.pipeline.states import LedgerStatus


class Compensator:
    """Works ledger rows with a processor of its own (its own owner: its claims never mix with the
    main agent's); see :class:`~app.compensation.redrive.Redriver` for ``lease_seconds`` and ``guard``."""

    def __init__(self, processor: Processor, ledger: Ledger, *, group: str, backoff: Backoff, lease_seconds: float,
                 max_event_bytes: int, reading: Reading = NATIVE) -> None:
        self.redriver = Redriver(processor, ledger, group=group, backoff=backoff, lease_seconds=lease_seconds,
                                 max_event_bytes=max_event_bytes, reading=reading)
        self.due = DueRows(self.redriver)
        self.dead_letters = DeadLetters(self.redriver, self.due)
        self.person = PersonActions(self.redriver)

    @property
    def processor(self) -> Processor:
        return self.redriver.processor

    async def handle_dead_letter(self, record: SourceRecord, guard) -> str:
        """One record of the dead-letter topic: it is acknowledged once this returns."""
        return await self.dead_letters.handle(record, guard)

    async def drain(self, guard, *, seconds: float, batch_size: int, actor: str = "timer") -> int:
        """Due rows, ``batch_size`` at a time, until none is due or ``seconds`` have passed."""
        return await self.due.drain(guard, seconds=seconds, batch_size=batch_size, actor=actor)

    async def run_due(self, limit: int, guard, *, actor: str = "timer") -> int:
        """This consumer group's rows whose retry is due, at most ``limit``, as one batch."""
        return await self.due.run_due(limit, guard, actor=actor)

    async def next_due(self, guard) -> float | None:
        """Seconds until a row of this group comes due."""
        return await self.due.next_due(guard)

    async def sleep_until_due(self, guard, longest: float) -> None:
        """Until the next row comes due (or a dead letter arrives), at most ``longest``."""
        await self.due.sleep_until_due(guard, longest)

    async def work(self, row: LedgerRow, guard, *, actor: str, note: str | None = None,
                   action: str = "redrive") -> LedgerStatus | None:
        """Claim the row, run its event again, and record what came of it."""
        return await self.redriver.work(row, guard, actor=actor, note=note, action=action)

    async def perform(self, row_id: int, action: str, guard, *, actor: str, note: str | None,
                      job_id: int | None = None) -> ActionResult:
        """A person's ``retry``, ``resolve`` or ``discard`` of one row."""
        return await self.person.perform(row_id, action, guard, actor=actor, note=note, job_id=job_id)

    async def bulk(self, action: str, row_ids: Sequence[int], guard, *, actor: str, note: str | None,
                   job_id: int, held: Callable[[], bool] = lambda: True) -> list[ItemOutcome]:
        """A bulk job's ``action`` on a chunk of rows (``app.compensation.bulk``)."""
        return await self.person.bulk(action, row_ids, guard, actor=actor, note=note, job_id=job_id, held=held)
