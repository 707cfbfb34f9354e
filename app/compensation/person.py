"""A person's actions on ledger rows (the console, the CLI) and a bulk job's chunk of them
(``app.compensation.bulk``): ``retry`` runs the row's event again (``app.compensation.redrive``);
``resolve`` and ``discard`` close the row, and settle its event's steps still pending. Each is
audited; doing one again changes nothing the second time and says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from app.compensation.bulk import CHANGED, FAILED, UNCHANGED, ItemOutcome, busy
from app.compensation.redrive import Redriver
from app.compensation.rules import PERSON_ONLY, STEP_OUTCOMES
from app.pipeline.model import ActionResult, LedgerRow
from app.pipeline.states import LEDGER_SETTLED, PERSON_ACTIONS, PERSON_CLAIMS, LedgerStatus

log = logging.getLogger(__name__)


class PersonActions:
    def __init__(self, redriver: Redriver) -> None:
        self.redriver = redriver
        self.ledger = redriver.ledger
        self.group = redriver.group
        self.lease_seconds = redriver.lease_seconds

    async def perform(self, row_id: int, action: str, guard, *, actor: str, note: str | None,
                      job_id: int | None = None) -> ActionResult:
        """A person's ``retry``, ``resolve`` or ``discard`` (the console, the CLI). Doing it
        again changes nothing the second time and says so. A resolve or discard also settles
        the event's steps still pending (they are no longer alerted on, and a replay never calls
        their service); it is refused while one of them is being called."""
        row = await guard(lambda: self.ledger.get(row_id, self.group))
        if row is None:
            return ActionResult(False, False, f"no compensation row {row_id}", None, None)
        if action == "retry":
            if row.status in LEDGER_SETTLED:
                return ActionResult(True, False, None, row.status, f"already {row.status.name.lower()}")
            if row.status is LedgerStatus.RETRYING:
                return ActionResult(True, False, "it is being retried right now; look again in a moment",
                                    row.status, row.message)
            if row.reason in PERSON_ONLY:
                return ActionResult(True, False, _person_only(row), row.status, row.message)
            status = await self.redriver.work(row, guard, actor=actor, note=note, action="retry")
            after = await guard(lambda: self.ledger.get(row_id, self.group))
            if status is None:
                return ActionResult(True, False, "another worker took the row over before this retry ended; look "
                                                 "again in a moment", after.status, after.message)
            return ActionResult(True, True, None, after.status, after.message)
        to, allowed = PERSON_ACTIONS[action]
        steps = self.redriver.pending_steps(row)
        after, changed, refusal = await guard(lambda: self.ledger.act(
            row_id, self.group, to, allowed, actor=actor, action=action, note=note, steps=steps,
            step_outcome=STEP_OUTCOMES[action], job_id=job_id))
        if refusal:
            return ActionResult(True, False, refusal, after.status, after.message)
        if not changed and after.status is not to:
            return ActionResult(True, False, f"cannot {action} a row that is {after.status.name.lower()} (only "
                                             f"{', '.join(s.name.lower() for s in sorted(allowed))})",
                                after.status, after.message)
        return ActionResult(True, changed, None, after.status, after.message)

    # -- a bulk job's chunk (app.compensation.bulk) ---------------------------------------

    async def bulk(self, action: str, row_ids: Sequence[int], guard, *, actor: str, note: str | None,
                   job_id: int, held: Callable[[], bool] = lambda: True) -> list[ItemOutcome]:
        """A bulk job's ``action`` on a chunk of rows, by ``perform``'s rules, audited with the
        job's id; what became of each row (busy: try it again later). Once ``held()`` is false
        (the job is no longer this runner's) no other row is begun: those get no outcome and
        stay the job's to work."""
        observer = self.redriver.processor.observer
        chunk = observer.chunk_began(job_id, action, len(row_ids))
        try:
            if action == "retry":
                return await self._retry_many(row_ids, guard, actor=actor, note=note, job_id=job_id, held=held,
                                              chunk=chunk)
            return await self._act_many(action, row_ids, guard, actor=actor, note=note, job_id=job_id, held=held)
        finally:
            if chunk is not None:
                observer.chunk_ended(chunk)

    async def _act_many(self, action: str, row_ids: Sequence[int], guard, *, actor: str, note: str | None,
                        job_id: int, held: Callable[[], bool]) -> list[ItemOutcome]:
        outcomes = []
        for row_id in row_ids:
            if not held():
                break
            result = await self.perform(row_id, action, guard, actor=actor, note=note, job_id=job_id)
            if not result.found or result.refused:
                outcomes.append(ItemOutcome(row_id, FAILED, result.refused))
            else:
                assert result.status is not None        # a row found has a status
                outcomes.append(ItemOutcome(row_id, CHANGED if result.changed else UNCHANGED,
                                            None if result.changed else f"already {result.status.name.lower()}"))
        return outcomes

    async def _retry_many(self, row_ids: Sequence[int], guard, *, actor: str, note: str | None,
                          job_id: int, held: Callable[[], bool], chunk: object | None = None) -> list[ItemOutcome]:
        """A person's retry of many rows at once: one claim, one pipeline batch, one settle (the
        due-row drain's path, with a person's claim: manual rows too)."""
        rows = {row.id: row for row in await guard(lambda: self.ledger.get_many(row_ids, self.group))}
        outcomes: dict[int, ItemOutcome] = {}
        wanted = []
        for row_id in row_ids:
            row = rows.get(row_id)
            if row is None:
                outcomes[row_id] = ItemOutcome(row_id, FAILED, f"no compensation row {row_id}")
            elif row.status in LEDGER_SETTLED:
                outcomes[row_id] = ItemOutcome(row_id, UNCHANGED, f"already {row.status.name.lower()}")
            elif row.reason in PERSON_ONLY:
                outcomes[row_id] = ItemOutcome(row_id, FAILED, _person_only(row))
            else:
                wanted.append(row_id)
        if not held():
            wanted = []          # the job is another's now: the rows are left to it, unclaimed
        owner = self.redriver.owner()
        claimed = await guard(lambda: self.ledger.claim_many(wanted, self.group, owner, self.lease_seconds,
                                                             allowed=PERSON_CLAIMS)) if wanted else []
        for row_id in set(wanted) - {row.id for row in claimed}:
            # Another claimant works it now (a redrive, a person, a job's earlier runner that
            # died: its claim runs out, and the row is tried again then).
            outcomes[row_id] = busy(row_id, "claimed by another worker right now")
        if claimed:
            if chunk is not None:
                self.redriver.processor.observer.chunk_claimed(chunk, claimed)
            settlements = await self.redriver.redrive(claimed, guard, owner, by_person=True, note=note, chunk=chunk)
            settled = await guard(lambda: self.ledger.settle(settlements, owner=owner, actor=actor, action="retry",
                                                             job_id=job_id))
            for row, s in zip(claimed, settlements):
                v = s.verdict
                if s.row_id not in settled:
                    outcomes[row.id] = busy(row.id, "its claim ran out before the retry ended")
                elif v.status in LEDGER_SETTLED:
                    outcomes[row.id] = ItemOutcome(row.id, CHANGED, v.detail)
                elif v.status is LedgerStatus.OPEN and v.redrives == row.redrives:
                    # Not this row's failure (a step's lease is held by another claimant): again later.
                    outcomes[row.id] = busy(row.id, v.detail)
                else:
                    outcomes[row.id] = ItemOutcome(row.id, FAILED, v.detail)
        return [outcomes[row_id] for row_id in row_ids if row_id in outcomes]


def _person_only(row: LedgerRow) -> str:
    """Why a retry is refused a case only a person can close."""
    return f"a retry cannot settle a {row.reason} row: {PERSON_ONLY[row.reason]}"
