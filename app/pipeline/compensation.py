"""The compensator: what becomes of a dead letter.

Every dead letter has a row in the compensation ledger (``t_compensation``), and the
row says what became of it:

==========  ==============================================================
open        waiting: for its retry (``next_retry_at``) or for the compensator
retrying    claimed right now (an owner and a lease, like a ``t_idem`` claim)
compensated the pipeline finished the original event (its steps are done)
superseded  the order moved past the event: nothing is left to do
manual      a person must look: not retriable, given up after N attempts,
            or a dead letter that could not even be read
resolved    a person fixed it by hand
discarded   a person decided it needs nothing
==========  ==============================================================

A row is worked by running its original event again through the same pipeline:
the same idempotency keys, so the same persisted tokens (a step already done is
skipped, a pending call is repeated with its token, never a new one). A call of a
non-idempotent effect whose outcome was unknown is verified with its service
before anything else, when the service offers that (the SMS gateway's lookup).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum
from typing import Protocol, Sequence

from app.pipeline.errors import LeaseHeld, MalformedEvent, PipelineError
from app.pipeline.events import decode
from app.pipeline.model import UNKNOWN
from app.pipeline.outcomes import Outcome
from app.pipeline.plan import step_keys
from app.pipeline.ports import SourceRecord
from app.pipeline.processor import Processor, Result
from app.pipeline.steps import PIPELINES

log = logging.getLogger(__name__)
_claims = itertools.count(1)


class Status(IntEnum):
    OPEN = 1
    RETRYING = 2
    COMPENSATED = 3
    MANUAL = 4
    DISCARDED = 5
    SUPERSEDED = 6
    RESOLVED = 7


SETTLED: frozenset[Status] = frozenset({Status.COMPENSATED, Status.DISCARDED, Status.SUPERSEDED, Status.RESOLVED})
WORKABLE: frozenset[Status] = frozenset({Status.OPEN, Status.MANUAL})     # a claim may start from these

# What a person may do, and from where; doing it twice changes nothing the second time.
ACTIONS: dict[str, tuple[Status, frozenset[Status]]] = {
    "resolve": (Status.RESOLVED, frozenset({Status.OPEN, Status.MANUAL})),
    "discard": (Status.DISCARDED, frozenset({Status.OPEN, Status.MANUAL})),
}


@dataclass(frozen=True, slots=True)
class SourceKey:
    """Which record a dead letter stands for (the ledger's unique key)."""

    group: str
    topic: str
    partition: int
    offset: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class LedgerRow:
    id: int
    status: Status
    reason: str
    message: str | None
    retriable: bool
    attempts: int                 # tries before it was dead-lettered
    redrives: int                 # times the compensator ran it again since
    due: bool                     # next_retry_at has passed (the database clock)
    next_retry_at: datetime | None
    order_no: str | None
    biz_key: str | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


class Ledger(Protocol):
    """The compensation ledger, as the compensator needs it."""

    async def find(self, source: SourceKey) -> LedgerRow | None: ...
    async def get(self, row_id: int) -> LedgerRow | None: ...
    async def add_manual(self, source: SourceKey, record: SourceRecord, reason: str, message: str) -> LedgerRow: ...
    async def due(self, group: str, limit: int) -> list[LedgerRow]: ...
    async def claim(self, row_id: int, owner: str, lease_seconds: float) -> LedgerRow | None: ...
    async def settle(self, row_id: int, owner: str, status: Status, *, redrives: int, retry_in: float | None,
                     actor: str, action: str, detail: str, note: str | None = None) -> bool: ...
    async def act(self, row_id: int, to: Status, allowed: frozenset[Status], *, actor: str, action: str,
                  note: str | None) -> tuple[LedgerRow | None, bool]: ...
    async def reopen_unknown(self, keys: Sequence[str]) -> int: ...


@dataclass(frozen=True)
class Backoff:
    """Capped exponential: ``base`` after the first failed redrive, doubling, at most ``cap``;
    after ``max_attempts`` redrives, a person's turn."""

    base: float
    cap: float
    max_attempts: int

    def after(self, redrives: int) -> float:
        return min(self.base * 2 ** max(redrives - 1, 0), self.cap)


@dataclass(frozen=True)
class Verdict:
    status: Status
    redrives: int
    retry_in: float | None
    detail: str


def judge(row: LedgerRow, result: Result, backoff: Backoff) -> Verdict:
    """What one redrive of the original event makes of its ledger row."""
    redrives = row.redrives + 1
    if result.outcome in (Outcome.APPLIED, Outcome.DUPLICATE):
        return Verdict(Status.COMPENSATED, redrives, None, f"the event ran: {result.outcome}")
    if result.outcome is Outcome.STALE:
        return Verdict(Status.SUPERSEDED, redrives, None, "the order moved past the event: nothing to do")
    error = result.error
    if error is None:       # superseded (another worker claimed its key) or deferred: look again soon
        return Verdict(Status.OPEN, row.redrives, backoff.base, f"not finished here ({result.outcome or 'deferred'})")
    if isinstance(error, LeaseHeld):    # somebody else is calling it now: not this row's failure
        return Verdict(Status.OPEN, row.redrives, max(error.wait_seconds, 1.0), f"{error.reason}: {error}")
    if not error.retriable:
        return Verdict(Status.MANUAL, redrives, None, f"not retriable: {error.reason}: {error}")
    if redrives >= backoff.max_attempts:
        return Verdict(Status.MANUAL, redrives, None, f"gave up after {redrives} redrives: {error.reason}: {error}")
    return Verdict(Status.OPEN, redrives, backoff.after(redrives), f"{error.reason}: {error}")


class Compensator:
    """Works ledger rows with a processor of its own (its own owner: its claims never mix
    with the main agent's). ``guard`` (an :class:`~app.pipeline.outage.OutageGuard`) runs
    every database step."""

    def __init__(self, processor: Processor, ledger: Ledger, *, group: str, backoff: Backoff, lease_seconds: float,
                 max_event_bytes: int) -> None:
        self.processor = processor
        self.ledger = ledger
        self.group = group
        self.backoff = backoff
        self.lease_seconds = lease_seconds
        self.max_event_bytes = max_event_bytes

    # -- where the work comes from -------------------------------------------------

    async def handle_dead_letter(self, record: SourceRecord, guard) -> str:
        """One record of the dead-letter topic: it is acknowledged once this returns."""
        source = source_of(record)
        if source is None:
            row = await guard(lambda: self.ledger.add_manual(
                SourceKey(self.group, record.topic, record.partition, record.offset,
                          -1 if record.timestamp_ms is None else record.timestamp_ms),
                record, "unreadable_dead_letter", "the dead letter's headers do not say where it came from"))
            log.error("dead letter %s[%s]@%s has no usable origin headers: ledger row %s, manual", record.topic,
                      record.partition, record.offset, row.id)
            return "manual"
        if source.group != self.group:
            log.warning("dead letter %s[%s]@%s belongs to consumer group %r, not %r: left to it", record.topic,
                        record.partition, record.offset, source.group, self.group)
            return "foreign"
        row = await guard(lambda: self.ledger.find(source))
        if row is None:
            row = await guard(lambda: self.ledger.add_manual(
                source, record, "no_ledger_row", "no ledger row for this dead letter (was it written by hand?)"))
            log.error("dead letter for %s[%s]@%s has no ledger row: row %s, manual", source.topic, source.partition,
                      source.offset, row.id)
            return "manual"
        if row.status in SETTLED or row.status is Status.MANUAL:
            return row.status.name.lower()
        if row.retriable and not row.due:
            return "not_due"         # the timer runs it when it is due; nothing loops through Kafka
        return (await self.work(row, guard, actor="compensator")).name.lower()

    async def run_due(self, limit: int, guard, *, actor: str = "timer") -> int:
        """This consumer group's rows whose retry is due, at most ``limit`` of them."""
        rows = await guard(lambda: self.ledger.due(self.group, limit))
        for row in rows:
            await self.work(row, guard, actor=actor)
        return len(rows)

    # -- the work --------------------------------------------------------------

    async def work(self, row: LedgerRow, guard, *, actor: str, note: str | None = None,
                   action: str = "redrive") -> Status:
        """Claim the row, run its event again, and record what came of it. A row that is not
        retriable goes to a person without a run, unless a person asked for the run."""
        owner = f"{self.processor.owner}#{next(_claims)}"      # one claim, one name: read back exactly
        claimed = await guard(lambda: self.ledger.claim(row.id, owner, self.lease_seconds))
        if claimed is None:
            return row.status        # somebody else has it, or it is settled
        if not claimed.retriable and claimed.reason != UNKNOWN and action == "redrive":
            verdict = Verdict(Status.MANUAL, claimed.redrives, None, f"not retriable: {claimed.reason}: "
                                                                     f"{claimed.message or ''}")
        else:
            verdict = await self._attempt(claimed, guard, by_person=action != "redrive")
        await guard(lambda: self.ledger.settle(claimed.id, owner, verdict.status, redrives=verdict.redrives,
                                               retry_in=verdict.retry_in, actor=actor, action=action,
                                               detail=verdict.detail[:1024], note=note))
        log.info("ledger row %s (%s): %s -> %s: %s", claimed.id, claimed.reason, claimed.status.name,
                 verdict.status.name, verdict.detail[:300])
        return verdict.status

    async def _attempt(self, row: LedgerRow, guard, *, by_person: bool = False) -> Verdict:
        try:
            event = decode(row.key, row.value, max_bytes=self.max_event_bytes)
        except MalformedEvent as exc:
            return Verdict(Status.MANUAL, row.redrives, None, f"not an event: {exc.reason}: {exc}")
        if row.reason == UNKNOWN:
            # The call's outcome is unknown and its service could not be asked then.
            verifiable = getattr(self.processor.effects, "verifiable", {})
            if not any(step.effect.name in verifiable for step in PIPELINES[event.type].effects):
                return Verdict(Status.MANUAL, row.redrives, None,
                               "the outcome of a call without idempotency key is unknown and its service offers "
                               "no lookup: reconcile by hand")
            await guard(lambda: self.ledger.reopen_unknown(step_keys(event)[1:]))
        try:
            [result] = await self.processor.run([event], guard, by_person=by_person)
        except PipelineError as exc:
            result = Result(error=exc)
        return judge(row, result, self.backoff)

    async def perform(self, row_id: int, action: str, guard, *, actor: str, note: str | None) -> ActionResult:
        """A person's ``retry``, ``resolve`` or ``discard`` (the console, the CLI). Doing it
        again changes nothing the second time and says so."""
        row = await guard(lambda: self.ledger.get(row_id))
        if row is None:
            return ActionResult(False, False, f"no compensation row {row_id}", None, None)
        if action == "retry":
            if row.status in SETTLED:
                return ActionResult(True, False, None, row.status, f"already {row.status.name.lower()}")
            if row.status is Status.RETRYING:
                return ActionResult(True, False, "it is being retried right now; look again in a moment",
                                    row.status, row.message)
            await self.work(row, guard, actor=actor, note=note, action="retry")
            after = await guard(lambda: self.ledger.get(row_id))
            return ActionResult(True, True, None, after.status, after.message)
        to, allowed = ACTIONS[action]
        after, changed = await guard(lambda: self.ledger.act(row_id, to, allowed, actor=actor, action=action,
                                                             note=note))
        if not changed and after.status is not to:
            return ActionResult(True, False, f"cannot {action} a row that is {after.status.name.lower()} (only "
                                             f"{', '.join(s.name.lower() for s in sorted(allowed))})",
                                after.status, after.message)
        return ActionResult(True, changed, None, after.status, after.message)


@dataclass(frozen=True)
class ActionResult:
    found: bool
    changed: bool
    refused: str | None          # why the action could not be done, if it could not
    status: Status | None
    message: str | None

    def as_dict(self) -> dict:
        return {"changed": self.changed, "status": None if self.status is None else self.status.name.lower(),
                "message": self.message}


def source_of(record: SourceRecord) -> SourceKey | None:
    """Where a dead letter came from, from its ``dlq.`` headers; None if they do not say."""
    try:
        h = {name: value.decode() for name, value in record.headers if name.startswith("dlq.") and value is not None}
        timestamp = h.get("dlq.original.timestamp", "")
        return SourceKey(h["dlq.consumer.group"], h["dlq.original.topic"], int(h["dlq.original.partition"]),
                         int(h["dlq.original.offset"]), int(timestamp) if timestamp else -1)
    except (KeyError, ValueError, UnicodeDecodeError):
        return None
