"""A redrive: ledger rows claimed, their original events run again through the same pipeline,
and what came of each settled (``app.compensation.rules.judge_redrive``). The compensator's three
sources of work stand on it: the dead-letter topic (``app.compensation.dead_letters``), the rows
whose retry is due (``app.compensation.due``) and a person's actions (``app.compensation.person``).

Every run of a row claims its event's steps under an owner of its own (the row's claim,
``<compensator>#n``): two rows of one step (a record and its re-published copy) worked at
once in one worker are two claimants, and the second waits for the first's lease instead
of calling the service a second time. A run that does not settle its row gives its
claims up, so the next one need not wait the lease out.
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from collections.abc import Sequence

from app.compensation.rules import Backoff, judge_redrive
from app.pipeline.breaker import Refusal
from app.pipeline.envelopes import Reading
from app.pipeline.errors import EffectHeld, Fatal, InternalError, MalformedEvent, PipelineError, ProviderUnavailable
from app.pipeline.events import NATIVE, OrderEvent, decode
from app.pipeline.model import UNKNOWN, LedgerRow, RedriveVerdict, Settlement
from app.pipeline.plan import step_keys
from app.pipeline.ports import Ledger
from app.pipeline.processor import Processor, Result
from app.pipeline.states import AUTOMATIC_CLAIMS, LEDGER_SETTLED, PERSON_CLAIMS, LedgerStatus
from app.pipeline.steps import PIPELINES

log = logging.getLogger(__name__)
_claims = itertools.count(1)


class Redriver:
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

    def owner(self) -> str:
        """A claimant of its own: one name for the row's claim and its steps' claims."""
        return f"{self.processor.owner}#{next(_claims)}"

    async def work(self, row: LedgerRow, guard, *, actor: str, note: str | None = None,
                   action: str = "redrive") -> LedgerStatus | None:
        """Claim the row, run its event again, and record what came of it. A row that is not
        retriable goes to a person without a run, unless a person asked for the run. None when
        the row could not be claimed, or its claim ran out before the run ended (another claim
        decides what becomes of it)."""
        owner = self.owner()
        allowed = AUTOMATIC_CLAIMS if action == "redrive" else PERSON_CLAIMS
        claimed = await guard(lambda: self.ledger.claim(row.id, owner, self.lease_seconds, allowed=allowed))
        if claimed is None:
            return None              # somebody else has it, or it is settled
        [settlement] = await self.redrive([claimed], guard, owner, by_person=action != "redrive", note=note)
        settled = await guard(lambda: self.ledger.settle([settlement], owner=owner, actor=actor, action=action))
        verdict = settlement.verdict
        if claimed.id not in settled:
            log.warning("ledger row %s (%s): its claim ran out before the %s ended; another claim decides", claimed.id,
                        claimed.reason, action)
            return None
        log.info("ledger row %s (%s): %s -> %s: %s", claimed.id, claimed.reason, claimed.status.name,
                 verdict.status.name, verdict.detail[:300])
        return verdict.status

    async def redrive(self, rows: Sequence[LedgerRow], guard, owner: str, *, by_person: bool = False,
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
            if (down := self._provider_down(event)) is not None and (down.by_person or not by_person):
                # Its provider is down, or a person holds its effect (a bulk job and a person's retry
                # hold it too): redriving it now would only claim its step again (each claim counts
                # towards IDEM_MAX_ATTEMPTS) to be refused. Again after the breaker's next probe (a
                # redrive due then may be the probe), or a while into the hold; no redrive counted.
                reason = EffectHeld.reason if down.by_person else ProviderUnavailable.reason
                decided[row.id] = Settlement(row.id, RedriveVerdict(
                    LedgerStatus.OPEN, row.redrives, max(down.wait, 1.0), f"{reason}: not redriven, {down.why}"))
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

    def pending_steps(self, row: LedgerRow) -> tuple[str, ...]:
        """The effect steps of the row's event (a record that is no event has none)."""
        try:
            return tuple(step_keys(decode(row.key, row.value, max_bytes=self.max_event_bytes, headers=row.headers,
                                          timestamp_ms=row.timestamp_ms, reading=self.reading))[1:])
        except MalformedEvent:
            return ()
