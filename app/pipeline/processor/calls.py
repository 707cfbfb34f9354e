"""T2: the calls, outside any transaction. An order's calls one after another in offset order (once
one fails, the order's later ones are not made), orders concurrently; each at its provider's pace
(``app.pipeline.limits``: a turn of its rate and concurrency, its breaker, its "not yet"), then one of
this processor's call slots, then the lease check, then the call. A call made and not yet recorded is
cut point B.

The lease is checked *before* each call, on this process's monotonic clock from the moment T1 began
(the lease the database wrote starts later than that, so the check is conservative)::

    T1 began            call may start           lease ends (DB clock)
       |----------------------|================|-------|
                               timeout + margin   (slack)

A call that could not finish inside the lease is not made: another worker may claim the key as soon
as the lease ends, and two calls for one key must never be in flight. The key is noted "not
delivered" and claimed again. With this process's heartbeat (``SelfFence``), a call is not made
either once this process may be taken for dead before it ends.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import replace

from app.pipeline.breaker import Admit
from app.pipeline.clock import Clock
from app.pipeline.errors import (
    ClaimExpiring,
    EffectHeld,
    EffectNotDelivered,
    KeyHorizonPassed,
    PipelineError,
    ProviderUnavailable,
    RateLimited,
)
from app.pipeline.limits import ProviderLimits
from app.pipeline.liveness_fence import SelfFence
from app.pipeline.model import EffectJob
from app.pipeline.observer import Observer
from app.pipeline.ports import EffectClient, Finished
from app.pipeline.processor.policy import ProcessorPolicy
from app.pipeline.processor.state import Run

Chain = tuple[list[Finished], set[int]]        # an order's calls' ends, and its events not called at all


class Calls:
    def __init__(self, effects: EffectClient, *, policy: ProcessorPolicy, limits: ProviderLimits,
                 fence: SelfFence | None, clock: Clock, observer: Observer) -> None:
        self.effects = effects
        self.lease_seconds = policy.lease_seconds
        self.call_needs = policy.call_needs
        self._slots = asyncio.Semaphore(policy.effect_concurrency)
        self.limits = limits
        self.fence = fence
        self.clock = clock
        self.observer = observer

    async def all(self, run: Run, jobs: list[EffectJob]) -> Chain:
        """Call every job; an order's jobs one after another in offset order, orders concurrently."""
        finished: list[Finished] = []
        skipped: set[int] = set()

        async def call_chain(chain: list[EffectJob]) -> None:
            done, passed = await self.chain(run, chain)
            finished.extend(done)
            skipped.update(passed)

        await asyncio.gather(*(call_chain(chain) for chain in chains(jobs).values()))
        return finished, skipped

    async def chain(self, run: Run, chain: list[EffectJob]) -> Chain:
        """One order's jobs, one after another in offset order. Once a job fails, the order's later
        jobs are not called (their events are deferred to the retries, so they still run after it, in
        order); they are recorded as not delivered, which they surely are."""
        finished: list[Finished] = []
        skipped: set[int] = set()
        for position, job in enumerate(chain):
            outcome = await self._paced(job, run.claimed_at, run.not_after, run.trace(job.index))
            finished.append(outcome)
            if outcome.error is not None:
                for later in chain[position + 1:]:
                    finished.append(Finished(later, error=EffectNotDelivered(
                        f"{later.biz_key}: not called, an earlier call of order {later.order_no} failed")))
                    if later.index != job.index:
                        skipped.add(later.index)
                break
        return finished, skipped

    async def _paced(self, job: EffectJob, claimed_at: float, not_after: float | None,
                     trace: object | None) -> Finished:
        """One job's call at its provider's pace: a slot and a turn of its effect's limits, then one
        of this worker's ``EFFECT_CONCURRENCY`` slots, then the lease check, then the call. A 429 is
        "not yet": nothing was done, so the same claim calls again after ``Retry-After``. The lease is
        checked again before that call; a wait past ``not_after`` is left to the caller."""
        effect = job.effect.name
        while True:
            admit, refusal = self.limits.admit(effect)
            if refusal is not None:
                refused = EffectHeld if refusal.by_person else ProviderUnavailable
                return Finished(job, error=refused(f"{job.biz_key}: not called, {refusal.why}",
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
            if not_after is not None and self.clock.now() + wait > not_after:
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

    async def _call(self, job: EffectJob, claimed_at: float, trace: object | None) -> Finished:
        if trace is None:
            return await self._made(job, claimed_at)
        with self.observer.calling(trace, job) as ended:
            finished = await self._made(job, claimed_at)
            ended(finished)
            return finished

    async def _made(self, job: EffectJob, claimed_at: float) -> Finished:
        """The call (or the lookup, then the call), if its claim has lease enough left."""
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
                self.observer.cut("looked_up")
                # The lookup took up to a call's time of the lease: the send needs its own.
                if (short := self._lease_short(job, claimed_at, after="the lookup (not found)")) is not None:
                    return short
            return Finished(job, receipt=await self.effects.call(job))
        except PipelineError as exc:
            return Finished(job, error=exc)

    def _lease_short(self, job: EffectJob, claimed_at: float, *, after: str = "") -> Finished | None:
        """A :class:`ClaimExpiring` end for ``job`` if its claim has too little lease left for a call,
        or this process may be taken for dead before the call ends (``SelfFence``)."""
        now = self.clock.now()
        left = self.lease_seconds - (now - claimed_at)
        if left < self.call_needs:
            why = f"the claim had {left:.1f}s of lease left and a call may take {self.call_needs:.1f}s"
        elif self.fence is not None and (refused := self.fence.refusal(claimed_at, self.call_needs, now)):
            why = refused
        else:
            return None
        return Finished(job, error=ClaimExpiring(f"{job.biz_key}: not called{' after ' + after if after else ''}, {why}"))


def chains(jobs: list[EffectJob]) -> dict[str, list[EffectJob]]:
    """Each order's jobs, in offset order."""
    by_order: dict[str, list[EffectJob]] = defaultdict(list)
    for job in jobs:
        by_order[job.order_no].append(job)
    return by_order
