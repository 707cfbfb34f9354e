"""The three transactions of the idempotent-step pipeline, for a list of events.

T1 claims and applies, T2 calls out, T3 records. For one effect step the
timeline and its crash windows (the cut points A, B and C) are::

    T1  BEGIN; read rows FOR UPDATE; claim key (pending, attempt n, token, lease);
        apply local step to t_order; COMMIT                        <- cut A
    T2  call the service with Idempotency-Key = token (no transaction, no lock)
                                                                   <- cut B: call made, no receipt
    T3  BEGIN; UPDATE t_idem SET status = done WHERE ... AND attempt = n;
        INSERT receipt; COMMIT                                     <- cut C

    crash before A   nothing was written: the replay starts from scratch
    crash A..B       row pending, lease running: the replay waits for the lease,
                     re-claims (attempt n+1, same token) and calls
    crash B..C       the service saw the token: the replay's call returns the
                     same waybill (200), T3 writes the one receipt
    crash after C    row done: the replay skips it

The attempt is the fencing token. A worker whose lease ran out while it was
in T2 finds ``attempt = n`` no longer matches in T3: another worker claimed
the key, so this one writes no receipt and leaves the key to it.

The lease is also checked *before* each call, on this process's monotonic
clock from the moment T1 began (the lease the database wrote starts later
than that, so the check is conservative)::

    T1 began            call may start           lease ends (DB clock)
       |----------------------|================|-------|
                               timeout + margin   (slack)

A call that could not finish inside the lease is not made: another worker may
claim the key as soon as the lease ends, and two calls for one key must never
be in flight. The key is noted "not delivered" and claimed again.

Once T2 is over, its outcomes are facts that must reach T3 as they are: a
failed T3 is retried with the same outcomes (never by running T1 and T2
again, which would find the SMS rows pending with no outcome and could only
call their sends unknown).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from opentelemetry.context import Context

from app.pipeline import tracing
from app.pipeline.breaker import Admit
from app.pipeline.errors import (
    ClaimExpiring,
    DatabaseSlow,
    EffectNotDelivered,
    Fatal,
    KeyHorizonPassed,
    PipelineError,
    ProviderUnavailable,
    RateLimited,
    StoreUnavailable,
)
from app.pipeline.events import OrderEvent
from app.pipeline.groups import Group
from app.pipeline.limits import ProviderLimits
from app.pipeline.liveness_fence import SelfFence
from app.pipeline.model import BatchPlan, EffectJob, EventPlan
from app.pipeline.outcomes import Outcome
from app.pipeline.plan import orders_needed, plan_batch, step_keys, window_matters
from app.pipeline.ports import EffectClient, Finished, NoObserver, Observer, Store, Transaction
from app.pipeline.retention import Retention
from app.pipeline.states import IdemStatus

log = logging.getLogger(__name__)
T = TypeVar("T")
Guard = Callable[[Callable[[], Awaitable[T]]], Awaitable[T]]


Settled = Callable[[list[int], list["Result"]], None]


async def _unguarded(work: Callable[[], Awaitable[T]]) -> T:
    return await work()


@dataclass(frozen=True, slots=True)
class Result:
    """How one event ended in one run of the pipeline."""

    outcome: Outcome | None = None      # applied, stale, duplicate or superseded when it ended well
    error: PipelineError | None = None
    deferred: bool = False              # not tried: an earlier event of its order is unfinished
    settled: str | None = None          # a duplicate whose steps ended without running: why (EventPlan.settled)

    @property
    def ok(self) -> bool:
        return self.outcome is not None


class Processor:
    """Runs events through their declared steps against a store and effect client."""

    def __init__(self, store: Store, effects: EffectClient, *, owner: str, lease_seconds: float,
                 effect_concurrency: int, effect_timeout: float = 0.0, lease_margin: float = 0.0,
                 tokens: Callable[[str], str],
                 on_cut: Callable[[str], None] = lambda cut: None,
                 clock: Callable[[], float] = time.monotonic, attempt_cap: int | None = None,
                 retention: Retention | None = None, observer: Observer | None = None,
                 fence: SelfFence | None = None, limits: ProviderLimits | None = None,
                 settle_group: int = 100, settle_after: float = 0.02) -> None:
        self.store = store
        self.effects = effects
        self.owner = owner
        self.lease_seconds = lease_seconds
        # A call starts only with this much of the claim's lease left.
        self.call_needs = effect_timeout + lease_margin
        self._slots = asyncio.Semaphore(effect_concurrency)
        # Each provider's pace (its rate share, its concurrency, its "not yet"), shared by every
        # processor of this worker: a provider limits the deployment's account, not one caller.
        self.limits = limits if limits is not None else ProviderLimits()
        self.tokens = tokens                    # a step's token from its key (app.pipeline.tokens)
        self._clock = clock
        self.attempt_cap = attempt_cap          # claims of a key before a person must decide
        self.retention = retention              # orders dated before its cutoff are refused
        self.observer = observer or NoObserver()
        # This process's heartbeat (app.pipeline.liveness_fence): with it, a call starts only while
        # nobody may have taken this process for dead, and claims of owners that are dead are
        # taken over at their death. None: leases alone (the tests of the rules without it).
        self.fence = fence
        # Called at each cut point of a batch that makes external calls
        # ("before_a", "a_b", "b_c", "after_c"); the chaos tests kill the process there.
        self._on_cut = on_cut
        # With a ``settled`` callback, finished calls are recorded (T3) in groups of up to this many
        # outcomes, or once the oldest has waited this long: a slow call holds up only its order.
        self.settle_group = settle_group
        self.settle_after = settle_after

    async def run(self, events: Sequence[OrderEvent], guard: Guard = _unguarded, *,
                  by_person: bool = False, owner: str | None = None, not_after: float | None = None,
                  settled: Settled | None = None, traces: Sequence[Context | None] | None = None) -> list[Result]:
        """One pass of ``events`` (offset order) through T1, T2 and T3.

        ``guard`` runs each database step; the batch handler passes one that waits
        out an unreachable database (and re-runs the step) within its budget.
        ``by_person``: a person asked for this run, so the attempt cap does not apply.
        ``owner``: who claims the steps, if not this processor's owner. A claim re-takes a
        live lease of its own owner (a batch's retries of its own records), so every
        claimant that may run beside another one of this process needs an owner of its own
        (the compensator gives each redrive one): two claims of one key must never both call.
        ``not_after``: the caller's deadline (this processor's clock). A call the provider answers
        "not yet" (429) is made again under the same claim once its ``Retry-After`` has passed, unless
        that is past ``not_after`` (or the claim's lease would be too short by then): then it ends
        :class:`RateLimited`, not delivered, and the caller waits.
        ``settled``: called with the indices of an order's events (and the results) as soon as every
        one of them has its result, while other orders' calls go on. Without it, T3 waits for every
        call of the run and records them at once.
        ``traces``: each event's trace context (its record's span, ``app.pipeline.tracing``), the parent
        of its T1, call and T3 spans; None: no spans.
        """
        if not tracing.on():
            traces = None
        # The cutoff once per batch; only an event dated before it is asked about.
        retention = self.retention
        cutoff = retention.cutoff() if retention is not None else None
        if retention is not None and cutoff is not None and any(event.part_date < cutoff for event in events):
            refused = [retention.refusal(event.order_no, event.part_date) for event in events]
            if any(refused):
                kept = [event for event, error in zip(events, refused) if error is None]
                kept_traces = None if traces is None else [t for t, error in zip(traces, refused) if error is None]
                results = iter(await self.run(kept, guard, by_person=by_person, owner=owner, not_after=not_after,
                                              traces=kept_traces)
                               if kept else [])     # the caller hears of every result when this returns
                return [Result(error=error) if error is not None else next(results) for error in refused]
        return await self._run(events, guard, None if by_person else self.attempt_cap, owner or self.owner, not_after,
                               settled, traces)

    async def _run(self, events: Sequence[OrderEvent], guard: Guard, attempt_cap: int | None,
                   owner: str, not_after: float | None = None, settled: Settled | None = None,
                   traces: Sequence[Context | None] | None = None) -> list[Result]:
        if not events:
            return []
        claimed_at = 0.0
        t1_started = tracing.now_ns() if traces else 0

        async def t1() -> BatchPlan:
            nonlocal claimed_at
            claimed_at = self._clock()      # each try's: a try after an outage claims anew
            if self.fence is not None and (why := self.fence.refusal(claimed_at, self.call_needs, claimed_at)):
                # No call could be made under a claim now, and each claim counts an attempt: none
                # is made until the heartbeat gets through again (waited out like the database), or
                # lands soon enough again (a slow database: waited out without spending the budget).
                if self.fence.answering(claimed_at):
                    raise DatabaseSlow(f"nothing is claimed: {why}; the heartbeats land, late")
                raise StoreUnavailable(f"nothing is claimed: {why}")
            return await self.store.in_transaction(lambda tx: self._t1(tx, events, attempt_cap, owner))

        plan = await guard(t1)
        self.observer.planned(plan)
        if traces:
            tracing.step_spans("T1", traces, t1_started, lambda i: _planned(plan.events[i], events[i]))
        results: list[Result | None] = [
            Result(outcome=p.outcome, settled=p.settled) if p.outcome else
            Result(error=p.error) if p.error else
            Result(deferred=True) if p.deferred else None
            for p in plan.events]
        jobs = [job for p in plan.events for job in p.jobs]
        if jobs and settled is not None:
            await self._settle_as_they_finish(events, plan, jobs, results, claimed_at, not_after, guard, owner,
                                              settled, traces)
        elif jobs:
            self._on_cut("a_b")
            finished, skipped = await self._t2(jobs, claimed_at, not_after, traces)
            self._on_cut("b_c")
            owned, broken = await self._t3(finished, guard, owner, traces)
            self._on_cut("after_c")
            self._settle(plan, finished, skipped, owned, broken, results)
        return results  # type: ignore[return-value]

    async def _t1(self, tx: Transaction, events: Sequence[OrderEvent], attempt_cap: int | None = None,
                  owner: str | None = None) -> BatchPlan:
        owner = owner or self.owner
        keys_of = [step_keys(event) for event in events]
        keys = sorted({key for keys in keys_of for key in keys})
        dates = sorted({event.part_date for event in events})
        rows = await tx.read_idem(keys, dates)
        if self.fence is not None:
            held = [row for row in rows.values()
                    if row.status is IdemStatus.PENDING and not row.expired and row.owner != owner]
            if held and (taken := await tx.take_over_dead(held, dead_after=self.fence.dead_after)):
                rows.update(await tx.read_idem(sorted(taken), dates))
        needed = orders_needed(events, rows, keys_of)
        orders = await tx.read_orders(sorted(needed)) if needed else {}
        verifiable = self.effects.verifiable
        # Only a batch with a claim that a recovery window would change reads the window.
        recovering = await tx.recovery_age() if window_matters(events, keys_of, rows, verifiable) else None
        plan = plan_batch(events, rows, orders, owner=owner, keys_of=keys_of, verifiable=verifiable,
                          contracts=self.effects.contracts, horizons=self.effects.horizons,
                          askable=self.effects.askable,
                          attempt_cap=attempt_cap, tokens=self.tokens, recovering=recovering)
        if plan.writes:
            await tx.apply_plan(plan, owner=owner, lease_seconds=self.lease_seconds)
        if any(p.jobs for p in plan.events):
            self._on_cut("before_a")
        return plan

    async def _t2(self, jobs: list[EffectJob], claimed_at: float, not_after: float | None = None,
                  traces: Sequence[Context | None] | None = None) -> tuple[list[Finished], set[int]]:
        """Call every job; an order's jobs one after another in offset order, orders concurrently."""
        finished: list[Finished] = []
        skipped: set[int] = set()

        async def run_chain(chain: list[EffectJob]) -> None:
            done, passed = await self._call_chain(chain, claimed_at, not_after, traces)
            finished.extend(done)
            skipped.update(passed)

        await asyncio.gather(*(run_chain(chain) for chain in _chains(jobs).values()))
        return finished, skipped

    async def _call_chain(self, chain: list[EffectJob], claimed_at: float, not_after: float | None,
                          traces: Sequence[Context | None] | None = None) -> tuple[list[Finished], set[int]]:
        """One order's jobs, one after another in offset order. Once a job fails, the order's later
        jobs are not called (their events are deferred to phase 2, so they still run after it, in
        order); they are recorded as not delivered, which they surely are."""
        finished: list[Finished] = []
        skipped: set[int] = set()
        for position, job in enumerate(chain):
            outcome = await self._paced_call(job, claimed_at, not_after,
                                             traces[job.index] if traces else None)
            finished.append(outcome)
            if outcome.error is not None:
                for later in chain[position + 1:]:
                    finished.append(Finished(later, error=EffectNotDelivered(
                        f"{later.biz_key}: not called, an earlier call of order {later.order_no} failed")))
                    if later.index != job.index:
                        skipped.add(later.index)
                break
        return finished, skipped

    async def _settle_as_they_finish(self, events: Sequence[OrderEvent], plan: BatchPlan, jobs: list[EffectJob],
                                     results: list[Result | None], claimed_at: float, not_after: float | None,
                                     guard: Guard, owner: str, settled: Settled,
                                     traces: Sequence[Context | None] | None = None) -> None:
        """T2 and T3 without the barrier: each order's chain of calls runs on its own, and what has
        finished is recorded in groups (``settle_group`` outcomes, or ``settle_after`` seconds after
        the first of a group finished, whichever comes first); each order is told its results as
        soon as its group's T3 has committed. Orders without calls are told at once."""
        of_order: dict[str, list[int]] = defaultdict(list)
        for index, event in enumerate(events):
            of_order[event.order_no].append(index)
        chains = _chains(jobs)
        for order, indices in of_order.items():
            if order not in chains:
                settled(indices, [results[i] for i in indices])     # type: ignore[misc]
        group = Group(self.settle_group, self.settle_after, producers=len(chains))

        async def record() -> None:
            while (taken := await group.next()) is not None:
                finished = [outcome for _, done, _ in taken for outcome in done]
                skipped = {index for _, _, passed in taken for index in passed}
                self._on_cut("b_c")
                owned, broken = await self._t3(finished, guard, owner, traces)
                self._on_cut("after_c")
                indices = [i for order, _, _ in taken for i in of_order[order]]
                self._settle(plan, finished, skipped, owned, broken, results, only=indices)
                for order, _, _ in taken:
                    settled(of_order[order], [results[i] for i in of_order[order]])   # type: ignore[misc]

        async def run_chain(order: str, chain: list[EffectJob]) -> None:
            done, passed = await self._call_chain(chain, claimed_at, not_after, traces)
            group.add((order, done, passed), len(done))

        self._on_cut("a_b")
        recorder = asyncio.ensure_future(record())
        try:
            await asyncio.gather(*(run_chain(order, chain) for order, chain in chains.items()))
        finally:
            group.close()           # what finished is recorded even if a chain broke: its calls were made
            await recorder

    async def _paced_call(self, job: EffectJob, claimed_at: float, not_after: float | None,
                          trace: Context | None = None) -> Finished:
        """One job's call at its provider's pace: a slot and a turn of its effect's limits, then one
        of this worker's ``EFFECT_CONCURRENCY`` slots, then the lease check, then the call. A 429 is
        "not yet": nothing was done, so the same claim calls again after ``Retry-After``. The lease is
        checked again before that call; a wait past ``not_after`` is left to the caller."""
        effect = job.effect.name
        while True:
            admit, refusal = self.limits.admit(effect)
            if refusal is not None:
                return Finished(job, error=ProviderUnavailable(f"{job.biz_key}: not called, {refusal.why}",
                                                               wait_seconds=refusal.wait))
            probe = admit is Admit.PROBE
            outcome: Finished | None = None
            waited = 0.0
            try:
                if self.limits.unpaced(effect):
                    # No limit set and no "not yet" in force: no turn to take (the common case, kept cheap).
                    async with self._slots:
                        outcome = await self._call(job, claimed_at, trace)
                else:
                    async with self.limits.call(effect, not_after) as turn:
                        waited = turn.waited
                        if turn.later is not None:
                            self.observer.paced(effect, waited)
                            return Finished(job, error=RateLimited(
                                f"{job.biz_key}: not called, its provider's limits give it a turn in "
                                f"{turn.later:.1f}s, past its batch's deadline", wait_seconds=turn.later))
                        async with self._slots:
                            outcome = await self._call(job, claimed_at, trace)
            finally:
                self._breaker_ended(effect, job.biz_key, outcome, probe)
            error = outcome.error
            limited = error.wait_seconds if isinstance(error, RateLimited) else None
            if waited or limited is not None:
                self.observer.paced(effect, waited, rate_limited=limited)
            if limited is None:
                return outcome
            self.limits.hold(effect, limited)
            wait = self.limits.wait_for(effect)
            if not_after is not None and self._clock() + wait > not_after:
                return outcome

    def _breaker_ended(self, effect: str, key: str, outcome: Finished | None, probe: bool) -> None:
        error = outcome.error if outcome is not None else None
        if outcome is None or isinstance(error, ClaimExpiring):
            failed: bool | None = None                   # no call was made
        else:
            failed = error is not None and error.provider_down
        change = self.limits.ended(effect, failed, probe=probe, key=key, error=str(error) if failed else "")
        if change is not None:
            self.observer.breaker(effect, change)

    async def _call(self, job: EffectJob, claimed_at: float, trace: Context | None = None) -> Finished:
        if trace is None:
            return await self._call_untraced(job, claimed_at)
        with tracing.effect_span(trace, job.effect.name, job.biz_key, job.attempt) as span:
            finished = await self._call_untraced(job, claimed_at)
            tracing.ended(span, "done" if finished.error is None else finished.error.reason, finished.error)
            return finished

    async def _call_untraced(self, job: EffectJob, claimed_at: float) -> Finished:
        if (short := self._lease_short(job, claimed_at)) is not None:
            return short
        try:
            if job.verify:
                # The last call's outcome is unknown: the service says whether it happened.
                found = await self.effects.lookup(job)
                if found is not None:
                    return Finished(job, receipt=found)
                if job.past_horizon is not None:
                    # The provider may have forgotten the key: "not found" proves nothing, and a
                    # send could be a second effect. A person decides (the row stays pending).
                    return Finished(job, error=KeyHorizonPassed(
                        f"{job.biz_key}: not called: its lookup found nothing under token {job.token}, which "
                        f"proves nothing now: {job.past_horizon}. If the provider did it, a retry finds it once "
                        "its lookup answers; if not, resolve or discard this dead letter and have the effect "
                        "made by hand"))
                # Verified: no earlier call reached the service. If the send is not made now
                # either, the row may say "not delivered" again.
                job = replace(job, earlier_unknown=False)
                self._on_cut("looked_up")
                # The lookup took up to a call's time of the lease: the send needs its own.
                if (short := self._lease_short(job, claimed_at, after="the lookup (not found)")) is not None:
                    return short
            return Finished(job, receipt=await self.effects.call(job))
        except PipelineError as exc:
            return Finished(job, error=exc)

    def _lease_short(self, job: EffectJob, claimed_at: float, *, after: str = "") -> Finished | None:
        """A :class:`ClaimExpiring` end for ``job`` if its claim has too little lease left for a call,
        or this process may be taken for dead before the call ends (``SelfFence``)."""
        now = self._clock()
        left = self.lease_seconds - (now - claimed_at)
        if left < self.call_needs:
            why = f"the claim had {left:.1f}s of lease left and a call may take {self.call_needs:.1f}s"
        elif self.fence is not None and (refused := self.fence.refusal(claimed_at, self.call_needs, now)):
            why = refused
        else:
            return None
        return Finished(job, error=ClaimExpiring(f"{job.biz_key}: not called{' after ' + after if after else ''}, {why}"))

    async def _t3(self, finished: list[Finished], guard: Guard, owner: str,
                  traces: Sequence[Context | None] | None = None) -> tuple[set[str], dict[str, PipelineError]]:
        if not traces:
            return await self._t3_untraced(finished, guard, owner)
        started = tracing.now_ns()
        owned, broken = await self._t3_untraced(finished, guard, owner)
        tracing.step_spans("T3", [traces[item.job.index] for item in finished], started,
                           lambda i: _recorded(finished[i], owned, broken))
        return owned, broken

    async def _t3_untraced(self, finished: list[Finished], guard: Guard,
                           owner: str) -> tuple[set[str], dict[str, PipelineError]]:
        """Record every outcome; return the keys still ours, and the keys whose outcome could not be written.

        An unreachable database is waited out by ``guard``, re-running T3 with the
        same outcomes (a T3 whose commit was lost finds its rows already moved by
        this owner and attempt, and counts them as its own). A statement the
        database refuses for good is a bug or bad data: the outcomes are then
        written one per transaction, so only the one that breaks is lost.
        """
        async def record(items: list[Finished]) -> set[str]:
            return await guard(lambda: self.store.in_transaction(
                lambda tx: tx.finish_effects(items, owner=owner)))

        try:
            return await record(finished), {}
        except (StoreUnavailable, Fatal):
            raise
        except Exception as exc:
            log.warning("T3 failed for %d outcomes (%r); writing them one by one", len(finished), exc)
        owned: set[str] = set()
        broken: dict[str, PipelineError] = {}
        for item in finished:
            try:
                owned |= await record([item])
            except (StoreUnavailable, Fatal):
                raise
            except Exception as exc:
                log.exception("T3 could not record the outcome of %s", item.job.biz_key)
                broken[item.job.biz_key] = PipelineError(
                    f"{item.job.biz_key}: the outcome of its call could not be recorded: {exc}",
                    reason=getattr(exc, "reason", "internal_error"))
        return owned, broken

    def _settle(self, plan: BatchPlan, finished: list[Finished], skipped: set[int], owned: set[str],
                broken: dict[str, PipelineError], results: list[Result | None],
                only: Sequence[int] | None = None) -> None:
        by_event: dict[int, list[Finished]] = defaultdict(list)
        for item in finished:
            by_event[item.job.index].append(item)
        for index in (range(len(plan.events)) if only is None else only):
            event_plan = plan.events[index]
            if results[index] is not None:
                continue
            done = by_event[index]
            failed = next((broken[f.job.biz_key] for f in done if f.job.biz_key in broken), None)
            if failed is not None:
                results[index] = Result(error=failed)
                continue
            if index in skipped:
                results[index] = Result(deferred=True)
                continue
            lost = [f.job.biz_key for f in done if f.job.biz_key not in owned]
            error = next((f.error for f in done if f.error is not None), None)
            if lost:
                # Fenced out in T3: another claimer owns these keys now and holds this event too.
                log.warning("lease lost before T3, leaving %s to the new owner", ", ".join(lost))
                results[index] = Result(outcome=Outcome.SUPERSEDED)
            elif error is not None:
                results[index] = Result(error=error)
            elif len(done) < len(event_plan.jobs):
                results[index] = Result(deferred=True)
            else:
                results[index] = Result(outcome=Outcome.APPLIED)


def _planned(plan: EventPlan, event: OrderEvent) -> dict:
    """A T1 span's attributes for one event: its keys, the attempts claimed, what the plan said."""
    attrs: dict = {"idem.key": step_keys(event)[0], "order.no": event.order_no, "event.type": event.type.value}
    if plan.jobs:
        attrs["outcome"] = "claimed"
        attrs["idem.claimed"] = [job.biz_key for job in plan.jobs]
        attrs["idem.attempt"] = max(job.attempt for job in plan.jobs)
    elif plan.outcome is not None:
        attrs["outcome"] = plan.outcome.value
    elif plan.error is not None:
        attrs["outcome"] = "error"
        attrs["error.type"] = plan.error.reason
    elif plan.deferred:
        attrs["outcome"] = "deferred"
    return attrs


def _recorded(item: Finished, owned: set[str], broken: dict[str, PipelineError]) -> dict:
    """A T3 span's attributes for one call's outcome."""
    key = item.job.biz_key
    outcome = ("error" if key in broken else "lost_lease" if key not in owned
               else "done" if item.error is None else item.error.reason)
    return {"idem.key": key, "idem.attempt": item.job.attempt, "outcome": outcome}


def _chains(jobs: list[EffectJob]) -> dict[str, list[EffectJob]]:
    """Each order's jobs, in offset order."""
    chains: dict[str, list[EffectJob]] = defaultdict(list)
    for job in jobs:
        chains[job.order_no].append(job)
    return chains
