"""The processor: a list of events through the three transactions of the idempotent-step pipeline.

T1 claims and applies (``claim``), T2 calls out (``calls``), T3 records (``record``). For one effect
step the timeline and its crash windows (the cut points A, B and C) are::

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

The observer is told at each cut point (``before_a``, ``a_b``, ``looked_up``, ``b_c``, ``after_c``): the
chaos run kills the process there (``app.chaos``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from app.pipeline.clock import REAL_TIME, Clock
from app.pipeline.events import OrderEvent
from app.pipeline.model import BatchPlan, EffectJob
from app.pipeline.observer import NoObserver, Observer
from app.pipeline.ports import EffectClient, Store, Transaction
from app.pipeline.processor.calls import Calls, Chain
from app.pipeline.processor.claim import Claims
from app.pipeline.processor.policy import ProcessorPolicy, Safeguards
from app.pipeline.processor.record import Records, settle
from app.pipeline.processor.state import Guard, Result, Run, Settled, unguarded


class Processor:
    """Runs events through their declared steps against a store and effect clients."""

    def __init__(self, store: Store, effects: EffectClient, *, owner: str, tokens: Callable[[str], str],
                 policy: ProcessorPolicy, safeguards: Safeguards | None = None, observer: Observer | None = None,
                 clock: Clock = REAL_TIME) -> None:
        guards = safeguards or Safeguards()
        self.store = store
        self.owner = owner
        self.tokens = tokens
        self.policy = policy
        self.call_needs = policy.call_needs
        self.limits = guards.limits
        self.fence = guards.fence
        self.retention = guards.retention
        self.observer: Observer = observer or NoObserver()
        self.claims = Claims(store, effects, tokens=tokens, policy=policy, fence=self.fence, clock=clock,
                             observer=self.observer)
        self.calls = Calls(effects, policy=policy, limits=self.limits, fence=self.fence, clock=clock,
                           observer=self.observer)
        self.records = Records(store, policy=policy, observer=self.observer)

    @property
    def effects(self) -> EffectClient:
        return self.calls.effects

    @effects.setter
    def effects(self, effects: EffectClient) -> None:
        """Other effect clients for T1's plans and T2's calls alike (a test's, wrapping the real ones)."""
        self.claims.effects = self.calls.effects = effects

    async def run(self, events: Sequence[OrderEvent], guard: Guard = unguarded, *,
                  by_person: bool = False, owner: str | None = None, not_after: float | None = None,
                  settled: Settled | None = None, traces: Sequence[object | None] | None = None) -> list[Result]:
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
        ``traces``: each event's record's trace, as the observer that follows records gave it
        (``Observer.batch_began``): the observer is told of its T1, calls and T3; None: not followed.
        """
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
        run = Run(events, guard, owner or self.owner, None if by_person else self.policy.attempt_cap, not_after,
                  traces)
        return await self._run(run, settled)

    async def _run(self, run: Run, settled: Settled | None) -> list[Result]:
        if not run.events:
            return []
        t1_began = time.time_ns() if run.traces else 0
        plan = run.plan = await self.claims.claim(run)                                      # T1, cut A
        self.observer.planned(plan)
        if run.traces:
            self.observer.claimed(run.traces, run.events, plan, t1_began)
        run.results = [
            Result(outcome=p.outcome, settled=p.settled) if p.outcome else
            Result(error=p.error) if p.error else
            Result(deferred=True) if p.deferred else None
            for p in plan.events]
        jobs = [job for p in plan.events for job in p.jobs]
        if jobs and settled is not None:
            await self.records.as_they_finish(run, jobs, self.calls, settled)              # order by order
        elif jobs:
            self.observer.cut("a_b")
            finished, skipped = await self._t2(run, jobs)                                   # T2, cut B
            self.observer.cut("b_c")
            owned, broken = await self.records.record(run, finished)                        # T3, cut C
            self.observer.cut("after_c")
            settle(run, finished, skipped, owned, broken)
        return run.results  # type: ignore[return-value]

    async def _t1(self, tx: Transaction, events: Sequence[OrderEvent], attempt_cap: int | None = None,
                  owner: str | None = None) -> BatchPlan:
        """T1's work inside a transaction of the caller's (the tests of its rules run it alone)."""
        return await self.claims.transaction(tx, events, attempt_cap, owner or self.owner)

    async def _t2(self, run: Run, jobs: list[EffectJob]) -> Chain:
        """Every call of the run (a test's processor may stall here, as a stopped process would)."""
        return await self.calls.all(run, jobs)
