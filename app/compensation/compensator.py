"""The compensator: works the compensation ledger's rows (their rules: ``app.compensation.rules``)
by running their original events again through the same pipeline.

Where the work comes from: each record of the dead-letter topic (the dead-letter agent,
in batches of at most 10), the rows whose retry is due (the timer drains them, a batch at a
time, as fast as the services answer), and a person's retry from the console or the CLI.

Every run of a row claims its event's steps under an owner of its own (the row's claim,
``<compensator>#n``): two rows of one step (a record and its re-published copy) worked at
once in one worker are two claimants, and the second waits for the first's lease instead
of calling the service a second time. A run that does not settle its row gives its
claims up, so the next one need not wait the lease out.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from app.compensation.bulk import CHANGED, FAILED, UNCHANGED, ItemOutcome, busy
from app.compensation.headers import origin_group, source_of
from app.compensation.rules import PERSON_ONLY, STEP_OUTCOMES, Backoff, judge_redrive
from app.pipeline.breaker import Refusal
from app.pipeline.envelopes import Reading
from app.pipeline.errors import Fatal, InternalError, MalformedEvent, PipelineError, ProviderUnavailable
from app.pipeline.events import NATIVE, OrderEvent, decode
from app.pipeline.model import UNKNOWN, ActionResult, LedgerRow, RedriveVerdict, Settlement, SourceKey
from app.pipeline.plan import step_keys
from app.pipeline.ports import Ledger, SourceRecord
from app.pipeline.processor import Processor, Result
from app.pipeline.states import AUTOMATIC_CLAIMS, LEDGER_SETTLED, PERSON_ACTIONS, PERSON_CLAIMS, LedgerStatus
from app.pipeline.steps import PIPELINES

log = logging.getLogger(__name__)
_claims = itertools.count(1)


class Compensator:
    """Works ledger rows with a processor of its own (its own owner: its claims never mix
    with the main agent's). ``guard`` (an :class:`~app.pipeline.outage.OutageGuard`) runs
    every database step. ``lease_seconds`` is how long a claim of a ledger row lasts: longer
    than one redrive can take, or another worker would claim the row while it is worked."""

    def __init__(self, processor: Processor, ledger: Ledger, *, group: str, backoff: Backoff, lease_seconds: float,
                 max_event_bytes: int, reading: Reading = NATIVE) -> None:
        self.processor = processor
        self.reading = reading
        self.ledger = ledger
        self.group = group
        self.backoff = backoff
        self.lease_seconds = lease_seconds
        self.max_event_bytes = max_event_bytes
        # Set when a dead letter arrives that is not due yet: the drain, asleep until the next due
        # row it knew of, looks again when this one comes due (``sleep_until_due``).
        self._new_letter = asyncio.Event()

    def _owner(self) -> str:
        """A claimant of its own: one name for the row's claim and its steps' claims."""
        return f"{self.processor.owner}#{next(_claims)}"

    # -- where the work comes from -------------------------------------------------

    async def handle_dead_letter(self, record: SourceRecord, guard) -> str:
        """One record of the dead-letter topic: it is acknowledged once this returns. A record
        the ledger cannot take (anything a person or a replay tool may write there) becomes a
        row for a person, or at least a log line; it never stops the worker."""
        try:
            return await self._handle_dead_letter(record, guard)
        except (Fatal, asyncio.CancelledError):
            raise
        except Exception as exc:
            log.exception("dead letter %s[%s]@%s could not be handled: %r", record.topic, record.partition,
                          record.offset, exc)
        bare = SourceRecord(record.topic, record.partition, record.offset, record.timestamp_ms, None, None)
        try:
            row = await guard(lambda: self.ledger.add_manual(
                SourceKey(self.group, record.topic, record.partition, record.offset,
                          -1 if record.timestamp_ms is None else record.timestamp_ms),
                bare, "unstorable_dead_letter", "the ledger could not take this dead letter as it is; read it on "
                                                f"the topic at {record.topic}[{record.partition}]@{record.offset}"))
        except Fatal:
            raise
        except Exception:
            log.exception("dead letter %s[%s]@%s could not even be recorded for a person; it stays on the topic",
                          record.topic, record.partition, record.offset)
            return "unstorable"
        log.error("dead letter %s[%s]@%s: ledger row %s, manual (unstorable_dead_letter)", record.topic,
                  record.partition, record.offset, row.id)
        return "manual"

    async def _handle_dead_letter(self, record: SourceRecord, guard) -> str:
        if record.unreadable is not None:
            # A record batch on the dead-letter topic that the client could not read: one row for
            # all of its records, keyed by the first (the one whose value is the raw batch).
            run = record.unreadable
            row = await guard(lambda: self.ledger.add_manual(
                SourceKey(self.group, record.topic, record.partition, run.first,
                          -1 if record.timestamp_ms is None else record.timestamp_ms),
                record, run.reason, f"a dead letter the client could not read (offsets {run.first}..{run.last}): "
                                    f"{run.message}"))
            log.error("dead letters %s[%s]@%s..%s could not be read (%s): ledger row %s, manual", record.topic,
                      record.partition, run.first, run.last, run.reason, row.id)
            return "manual"
        group = origin_group(record)
        if group is not None and group != self.group:
            log.warning("dead letter %s[%s]@%s belongs to consumer group %r, not %r: left to it", record.topic,
                        record.partition, record.offset, group[:300], self.group)
            return "foreign"
        try:
            source = source_of(record)
        except ValueError as exc:
            why = str(exc)      # the except block unbinds exc; the lambda may run again under guard
            row = await guard(lambda: self.ledger.add_manual(
                SourceKey(self.group, record.topic, record.partition, record.offset,
                          -1 if record.timestamp_ms is None else record.timestamp_ms),
                record, "unreadable_dead_letter", f"the dead letter's headers do not say where it came from: {why}"))
            log.error("dead letter %s[%s]@%s has no usable origin headers (%s): ledger row %s, manual", record.topic,
                      record.partition, record.offset, why, row.id)
            return "manual"
        row = await guard(lambda: self.ledger.find(source))
        if row is None:
            row = await guard(lambda: self.ledger.add_manual(
                source, record, "no_ledger_row", "no ledger row for this dead letter (was it written by hand?)"))
            log.error("dead letter for %s[%s]@%s has no ledger row: row %s, manual", source.topic, source.partition,
                      source.offset, row.id)
            return "manual"
        if row.status in LEDGER_SETTLED or row.status is LedgerStatus.MANUAL:
            return row.status.name.lower()
        if row.retriable and not row.due:
            self._new_letter.set()
            return "not_due"         # the drain runs it when it is due; nothing loops through Kafka
        status = await self.work(row, guard, actor="compensator")
        return "busy" if status is None else status.name.lower()

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
        owner = self._owner()
        rows = await guard(lambda: self.ledger.claim_due(self.group, limit, owner, self.lease_seconds))
        if not rows:
            return 0
        settlements = await self._redrive(rows, guard, owner)
        settled = await guard(lambda: self.ledger.settle(settlements, owner=owner, actor=actor, action="redrive"))
        for s in settlements:
            if s.row_id not in settled:
                log.warning("ledger row %s: its claim ran out before the redrive ended; another claim decides", s.row_id)
            else:
                log.info("ledger row %s: -> %s: %s", s.row_id, s.verdict.status.name, s.verdict.detail[:300])
        return len(rows)

    # -- the work --------------------------------------------------------------

    async def work(self, row: LedgerRow, guard, *, actor: str, note: str | None = None,
                   action: str = "redrive") -> LedgerStatus | None:
        """Claim the row, run its event again, and record what came of it. A row that is not
        retriable goes to a person without a run, unless a person asked for the run. None when
        the row could not be claimed, or its claim ran out before the run ended (another claim
        decides what becomes of it)."""
        owner = self._owner()
        allowed = AUTOMATIC_CLAIMS if action == "redrive" else PERSON_CLAIMS
        claimed = await guard(lambda: self.ledger.claim(row.id, owner, self.lease_seconds, allowed=allowed))
        if claimed is None:
            return None              # somebody else has it, or it is settled
        [settlement] = await self._redrive([claimed], guard, owner, by_person=action != "redrive", note=note)
        settled = await guard(lambda: self.ledger.settle([settlement], owner=owner, actor=actor, action=action))
        verdict = settlement.verdict
        if claimed.id not in settled:
            log.warning("ledger row %s (%s): its claim ran out before the %s ended; another claim decides", claimed.id,
                        claimed.reason, action)
            return None
        log.info("ledger row %s (%s): %s -> %s: %s", claimed.id, claimed.reason, claimed.status.name,
                 verdict.status.name, verdict.detail[:300])
        return verdict.status

    async def _redrive(self, rows: Sequence[LedgerRow], guard, owner: str, *, by_person: bool = False,
                       note: str | None = None, chunk: object | None = None) -> list[Settlement]:
        """Run the rows' events through the pipeline at once (in ledger order: an order's letters
        in the order they were written); a row whose event cannot run is decided without.

        Traced, each row's run is a span (``redrive dead letter``, or ``retry dead letter`` when a person
        asked) linked to the context its dead letter kept; a trace of its own, or a child of a bulk
        job's ``chunk``."""
        decided: dict[int, Settlement] = {}
        retention = self.processor.retention
        latest = retention.latest() if retention is not None else None
        runs: dict[tuple[str, str], list[tuple[LedgerRow, OrderEvent]]] = defaultdict(list)
        for row in sorted(rows, key=lambda r: r.id):
            if not row.retriable and row.reason != UNKNOWN and not by_person:
                decided[row.id] = Settlement(row.id, RedriveVerdict(LedgerStatus.MANUAL, row.redrives, None,
                                                             f"not retriable: {row.reason}: {row.message or ''}"))
                continue
            try:
                event = decode(row.key, row.value, max_bytes=self.max_event_bytes, latest=latest,
                               headers=row.headers, timestamp_ms=row.timestamp_ms, reading=self.reading)
            except MalformedEvent as exc:
                decided[row.id] = Settlement(row.id, RedriveVerdict(LedgerStatus.MANUAL, row.redrives, None,
                                                             f"not an event: {exc.reason}: {exc}"))
                continue
            if not by_person and (down := self._provider_down(event)) is not None:
                # Its provider is down: redriving it now would only claim its step again (each claim
                # counts towards IDEM_MAX_ATTEMPTS) to be refused. Again after the breaker's next probe,
                # no redrive counted; a redrive due then may be the probe.
                decided[row.id] = Settlement(row.id, RedriveVerdict(
                    LedgerStatus.OPEN, row.redrives, max(down.wait, 1.0),
                    f"{ProviderUnavailable.reason}: not redriven, {down.why}"))
                continue
            if row.reason == UNKNOWN:
                # The call's outcome is unknown and its service could not be asked then.
                verifiable = self.processor.effects.verifiable
                if not any(step.effect.name in verifiable for step in PIPELINES[event.type].effects):
                    decided[row.id] = Settlement(row.id, RedriveVerdict(
                        LedgerStatus.MANUAL, row.redrives, None,
                        "the outcome of a call without idempotency key is unknown and its service offers no lookup: "
                        "reconcile by hand"))
                    continue
                reopened = step_keys(event)[1:]
                await guard(lambda keys=reopened: self.ledger.reopen_unknown(keys))
            # Copies of one request (a record and its re-published copy) run once and share its end.
            runs[step_keys(event)[0], event.payload_hash].append((row, event))
        if runs:
            leads = [copies[0][1] for copies in runs.values()]
            observer = self.processor.observer
            traces = observer.redrives_began([copies[0][0] for copies in runs.values()], leads, by_person=by_person,
                                             chunk=chunk)
            try:
                results = await self._run(leads, guard, owner, by_person, traces)
            except BaseException:
                for trace in traces or ():
                    observer.redrive_ended(trace, None, None)
                raise
            for at, (copies, result) in enumerate(zip(runs.values(), results)):
                for row, event in copies:
                    verdict = judge_redrive(row, result, self.backoff)
                    release = () if verdict.status in LEDGER_SETTLED else tuple(step_keys(event)[1:])
                    decided[row.id] = Settlement(row.id, verdict, release)
                if traces is not None:
                    observer.redrive_ended(traces[at], verdict.status.name.lower(), result.error)
        return [Settlement(s.row_id, s.verdict, s.release, note) for s in (decided[row.id] for row in rows)]

    def _provider_down(self, event: OrderEvent) -> Refusal | None:
        """The refusal of the first provider ``event`` calls whose breaker is open, if any."""
        limits = self.processor.limits
        return next((refusal for step in PIPELINES[event.type].effects
                     if (refusal := limits.refusal(step.effect.name)) is not None), None)

    async def _run(self, events: list[OrderEvent], guard, owner: str, by_person: bool,
                   traces: Sequence[object | None] | None = None) -> list[Result]:
        try:
            return await self.processor.run(events, guard, by_person=by_person, owner=owner, traces=traces)
        except Fatal:
            raise
        except PipelineError as exc:
            if len(events) == 1:
                return [Result(error=exc)]
        except Exception:
            if len(events) == 1:
                raise
            log.exception("a redrive of %d events failed; running them one by one", len(events))
        results = []
        for at, event in enumerate(events):
            try:
                results.extend(await self.processor.run([event], guard, by_person=by_person, owner=owner,
                                                        traces=None if traces is None else [traces[at]]))
            except Fatal:
                raise
            except Exception as exc:
                log.exception("internal error redriving %s", event.event_id)
                results.append(Result(error=InternalError(f"{exc.__class__.__name__}: {exc}")))
        return results

    # -- a person's actions ------------------------------------------------------

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
            status = await self.work(row, guard, actor=actor, note=note, action="retry")
            after = await guard(lambda: self.ledger.get(row_id, self.group))
            if status is None:
                return ActionResult(True, False, "another worker took the row over before this retry ended; look "
                                                 "again in a moment", after.status, after.message)
            return ActionResult(True, True, None, after.status, after.message)
        to, allowed = PERSON_ACTIONS[action]
        steps = self._pending_steps(row)
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
        observer = self.processor.observer
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
        owner = self._owner()
        claimed = await guard(lambda: self.ledger.claim_many(wanted, self.group, owner, self.lease_seconds,
                                                             allowed=PERSON_CLAIMS)) if wanted else []
        for row_id in set(wanted) - {row.id for row in claimed}:
            # Another claimant works it now (a redrive, a person, a job's earlier runner that
            # died: its claim runs out, and the row is tried again then).
            outcomes[row_id] = busy(row_id, "claimed by another worker right now")
        if claimed:
            if chunk is not None:
                self.processor.observer.chunk_claimed(chunk, claimed)
            settlements = await self._redrive(claimed, guard, owner, by_person=True, note=note, chunk=chunk)
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

    def _pending_steps(self, row: LedgerRow) -> tuple[str, ...]:
        """The effect steps of the row's event (a record that is no event has none)."""
        try:
            return tuple(step_keys(decode(row.key, row.value, max_bytes=self.max_event_bytes, headers=row.headers,
                                          timestamp_ms=row.timestamp_ms, reading=self.reading))[1:])
        except MalformedEvent:
            return ()


def _person_only(row: LedgerRow) -> str:
    """Why a retry is refused a case only a person can close."""
    return f"a retry cannot settle a {row.reason} row: {PERSON_ONLY[row.reason]}"
