"""T1: claim and apply, in one transaction. The rows of every step key of the run are read under lock
(with the orders they touch, and the recovery window when it could change a claim), the plan decided
(``app.pipeline.plan``), and what it writes written: each effect step's key claimed (pending, its
attempt, its token, a lease), each local step applied to ``t_order``. Committed, that is cut point A.

With this process's heartbeat (``SelfFence``), claims of owners that are dead are taken over at their
death, and nothing is claimed while no call could be made under a claim."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.pipeline.clock import Clock
from app.pipeline.errors import DatabaseSlow, StoreUnavailable
from app.pipeline.events import OrderEvent
from app.pipeline.liveness_fence import SelfFence
from app.pipeline.model import BatchPlan
from app.pipeline.observer import Observer
from app.pipeline.plan import orders_needed, plan_batch, step_keys, window_matters
from app.pipeline.ports import EffectClient, Store, Transaction
from app.pipeline.processor.policy import ProcessorPolicy
from app.pipeline.processor.state import Run
from app.pipeline.states import IdemStatus


class Claims:
    def __init__(self, store: Store, effects: EffectClient, *, tokens: Callable[[str], str], policy: ProcessorPolicy,
                 fence: SelfFence | None, clock: Clock, observer: Observer) -> None:
        self.store = store
        self.effects = effects
        self.tokens = tokens                    # a step's token from its key (app.pipeline.tokens)
        self.lease_seconds = policy.lease_seconds
        self.call_needs = policy.call_needs
        self.fence = fence
        self.clock = clock
        self.observer = observer

    async def claim(self, run: Run) -> BatchPlan:
        """T1 of ``run``'s events, through its guard (again after an outage: the claim begins anew)."""
        async def t1() -> BatchPlan:
            run.claimed_at = claimed_at = self.clock.now()
            if self.fence is not None and (why := self.fence.refusal(claimed_at, self.call_needs, claimed_at)):
                # No call could be made under a claim now, and each claim counts an attempt: none
                # is made until the heartbeat gets through again (waited out like the database), or
                # lands soon enough again (a slow database: waited out without spending the budget).
                if self.fence.answering(claimed_at):
                    raise DatabaseSlow(f"nothing is claimed: {why}; the heartbeats land, late")
                raise StoreUnavailable(f"nothing is claimed: {why}")
            return await self.store.in_transaction(
                lambda tx: self.transaction(tx, run.events, run.attempt_cap, run.owner))

        return await run.guard(t1)

    async def transaction(self, tx: Transaction, events: Sequence[OrderEvent], attempt_cap: int | None,
                          owner: str) -> BatchPlan:
        """What T1 does inside its transaction."""
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
            self.observer.cut("before_a")
        return plan
