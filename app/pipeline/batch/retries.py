"""The per-record retries: each record of an order that failed retriably on its first try, or was
deferred behind one that did, on its own, in offset order; up to ``len(backoff)`` retries with those
delays. A record waiting for another worker's lease waits for the lease instead (bounded by
``max_lease_wait``), without using up its retries; so does a record its provider answered "not yet"
(429, ``Retry-After``), and one its provider's open breaker refused (held until it closes, or near the
deadline). Past the batch's deadline a record still waiting is dead-lettered as retriable
(``deadline_exceeded``) and the compensator goes on with it; a call already in flight is waited for.

Records of an order that ask for the same thing (the same idempotency key and payload) are one piece of
work: the first one is tried, the others share its end. A bug met while trying one record is that
record's: it is dead-lettered as ``internal_error``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import app.pipeline.batch.dead_letters as dead_letters
import app.pipeline.batch.holds as holds
from app.pipeline import letters
from app.pipeline.batch.state import Batch, Item
from app.pipeline.errors import (
    EffectHeld,
    Fatal,
    InternalError,
    LeaseHeld,
    PipelineError,
    PreconditionNotMet,
    ProviderUnavailable,
    RateLimited,
)
from app.pipeline.outcomes import Outcome
from app.pipeline.ports import DeadLetter
from app.pipeline.processor import Result

log = logging.getLogger(__name__)

Retry = list[tuple[Item, PipelineError | None]]      # a record and its last error (None: not tried yet)


async def retry_order(batch: Batch, retry: Retry, dead: list[DeadLetter], waiting: int = 1) -> None:
    """An order's records that failed retriably, or were deferred behind one that did, on their own:
    in offset order, each retried with backoff until it ends well or must be dead-lettered (its letter
    added to ``dead``). ``waiting``: the order's records in this part (they count as held with it).

    A record whose order is not ready for it (a CONFIRM before its CREATED: it did nothing) gives
    way to the order's later records, which may be what it waits for, and is tried again after
    them; once every record left has given way since the last that ended well, they are retried
    with backoff as the others."""
    pieces = deque(pieces_of_work(retry))               # in offset order of their first record
    gave_way = 0                     # records that gave way in a row, none ending well since
    ended_well = 0
    waited_at: dict[int, int] = {}   # a record that gave way -> ended_well then
    while pieces:
        lead, error, same = pieces.popleft()
        may_give_way = gave_way < len(pieces)
        if id(lead) in waited_at and ended_well > waited_at.pop(id(lead)):
            error = None                 # the order moved since it gave way: tried again at once
        elif may_give_way and isinstance(error, PreconditionNotMet):
            pieces.append((lead, error, same))
            waited_at[id(lead)] = ended_well
            gave_way += 1
            continue
        retried = await _retry(batch, lead, error, waiting, give_way=may_give_way)
        if isinstance(retried, GivenUp):
            continue            # given up by a rebalance while held: its new owner works it (and its copies)
        if isinstance(retried, _NotReady):
            pieces.append((lead, retried.error, same))
            waited_at[id(lead)] = ended_well
            gave_way += 1
            continue
        if isinstance(retried, Result):
            gave_way = 0
            ended_well += 1
            assert retried.outcome is not None          # a result that ended well
            batch.ended(lead, retried.outcome, same)
            continue
        dead.append(dead_letters.of_item(batch, lead, retried))
        for item in same:
            item.attempts, item.first_failure = lead.attempts, lead.first_failure
            dead.append(dead_letters.of_item(batch, item, letters.same_request(retried, lead.record)))


async def _retry(batch: Batch, item: Item, error: PipelineError | None, waiting: int = 1, *,
                 give_way: bool = False) -> Result | PipelineError | _NotReady | GivenUp:
    """Retry one record until it succeeds (the result) or must be dead-lettered (the error);
    ``give_way``: a first try that finds its order not ready for it returns at once."""
    policy, now, report = batch.crew.policy, batch.crew.clock.now, batch.report
    retries = 0
    lease_waited = 0.0
    while True:
        wait, lease_wait, not_yet = 0.0, False, False
        if error is None:
            pass                                       # deferred in the first try: not tried yet
        elif isinstance(error, ProviderUnavailable):
            # Claimed before the breaker opened (or the person's hold was seen): held too, until it
            # closes or lets this one probe (a person's hold: until it ends, whatever the deadline).
            by_person = isinstance(error, EffectHeld)
            if not holds.waits(batch, error) or (not by_person and now() >= holds.until(batch)):
                return error
            if not await holds.hold(batch, [item], waiting):     # the order's records of this part wait with it
                return GivenUp()
            not_yet = True
        elif isinstance(error, LeaseHeld) and lease_waited < policy.max_lease_wait:
            wait, lease_wait = min(error.wait_seconds + 0.05, policy.max_lease_wait - lease_waited), True
        elif isinstance(error, RateLimited):
            wait, not_yet = error.wait_seconds or 0.0, True    # the provider's "not yet": no retry used
        elif error.retriable and error.retry_in_batch and not isinstance(error, LeaseHeld) \
                and retries < len(policy.backoff):
            wait = policy.backoff[retries]
        else:
            return error
        if now() + wait > batch.deadline:
            return letters.past_deadline(error, policy.deadline)
        if lease_wait:
            report.lease_waits += 1
            lease_waited += wait
        elif not_yet:
            if isinstance(error, RateLimited):
                report.rate_limited += 1
        elif error is not None:
            report.retries[error.reason] += 1
            retries += 1
        if wait:
            await batch.crew.clock.sleep(wait)
        result = await _run_one(batch, item)
        if result.ok:
            return result
        tried_first = error is None
        error = result.error or PipelineError("deferred in a batch of one", reason="deferred")
        item.attempts += 1
        item.first_failure = item.first_failure or letters.now()
        if give_way and tried_first and isinstance(error, PreconditionNotMet):
            return _NotReady(error)


async def _run_one(batch: Batch, item: Item) -> Result:
    try:
        [result] = await batch.crew.processor.run([item.event], batch.guard, not_after=batch.deadline,
                                             traces=batch.traces([item]))
        return result
    except Fatal:
        raise
    except Exception as exc:
        log.exception("internal error on %s[%s]@%s", item.record.topic, item.record.partition, item.record.offset)
        return Result(error=InternalError(f"{exc.__class__.__name__}: {exc}"))


@dataclass(frozen=True, slots=True)
class GivenUp:
    """A record held by a person's hold was given up by a rebalance meanwhile: not worked here."""


@dataclass(frozen=True, slots=True)
class _NotReady:
    """A record's first try found its order not ready for it: it gives way to the order's next ones."""

    error: PipelineError


Piece = tuple[Item, PipelineError | None, list[Item]]


def pieces_of_work(chain: Retry) -> list[Piece]:
    """``(lead, its error, the other records asking for the same thing)``, in offset order of the leads."""
    pieces: dict[tuple[str, str], Piece] = {}
    for item, error in chain:
        work = item.work
        if work in pieces:
            pieces[work][2].append(item)
        else:
            pieces[work] = (item, error, [])
    return list(pieces.values())


def copies_follow_their_lead(items: list[Item], results: Sequence[Result]) -> list[tuple[Item, Result, list[Item]]]:
    """``(record, its result, its copies)`` in offset order: a record asking for what an earlier
    record of the batch asks for (the same request, the same payload) was answered
    ``duplicate`` by the plan before its lead's calls were made. It ends as its lead does:
    a duplicate when the lead ends well, dead-lettered with it (or retried with it) when it
    does not, never read past while the request it repeats failed."""
    leads: dict[tuple[str, str], tuple[Item, Result, list[Item]]] = {}
    ordered: list[tuple[Item, Result, list[Item]]] = []
    for item, result in zip(items, results):
        work = item.work
        first = leads.get(work)
        if first is not None and result.outcome is Outcome.DUPLICATE:
            first[2].append(item)
            continue
        entry: tuple[Item, Result, list[Item]] = (item, result, [])
        leads.setdefault(work, entry)
        ordered.append(entry)
    return ordered
