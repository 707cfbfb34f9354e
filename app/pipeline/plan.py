"""T1's decision, as a pure function of what T1 read.

The store reads the ``t_idem`` rows of every step key of the batch and the
orders they touch (``SELECT ... FOR UPDATE``), calls :func:`plan_batch`, and
writes what it returns in the same transaction. Deciding in Python under the
row locks keeps one round trip per statement for the whole batch; each write
still carries its rule as a SQL condition (see ``app.adapters.mysql``).

Events are judged in offset order. Once an event of an order fails in a way
that a retry may fix, the later events of that order in the batch are
*deferred*: they run after it, in phase 2, so an order's events never
overtake each other.

An effect is never called for an order in a state that voids it: by default
every state past its step's target (a CONFIRM's waybill when a CANCEL came
after; ``EffectStep.voided_by`` names them otherwise). Its row is failed as
``stale`` without a call, whether it is claimed for the first time or again
(the effect form of "a cancelled order got confirmed again").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from operator import attrgetter

from app.pipeline.effect_cases import CASE_ACTIONS, ClaimContext, EffectSteps, effect_case
from app.pipeline.errors import (
    PayloadMismatch,
    PreconditionNotMet,
    StaleEffectMayExist,
)
from app.pipeline.events import OrderEvent
from app.pipeline.model import (
    NOT_DELIVERED,
    STALE,
    BatchPlan,
    EventPlan,
    FailRow,
    IdemRow,
    NewRow,
)
from app.pipeline.outcomes import Outcome
from app.pipeline.states import TERMINAL, IdemStatus, MoveVerdict, Order, judge_move
from app.pipeline.steps import PIPELINES, Contract, LocalStep

_APPLY = MoveVerdict.APPLY.value
_VERDICT_VALUE = {verdict: verdict.value for verdict in MoveVerdict}
_OUTCOME = {outcome.value: outcome for outcome in Outcome}      # Outcome(value), without Enum's call
_ORDER_FIELDS = tuple(f.name for f in fields(Order))
_ORDER_VALUES = attrgetter(*_ORDER_FIELDS)
_ORDER_AT = {name: at for at, name in enumerate(_ORDER_FIELDS)}
_STATUS_AT = _ORDER_AT["status"]


def step_keys(event: OrderEvent) -> list[str]:
    """Every idempotency key the event's pipeline uses, local step first."""
    pipe = PIPELINES[event.type]
    return [pipe.key(event, pipe.local)] + [pipe.key(event, step) for step in pipe.effects]


def keys_per_event() -> int:
    """The most t_idem rows one event writes (its local step and its effect steps)."""
    return max(1 + len(pipe.effects) for pipe in PIPELINES.values())


def orders_needed(events: Sequence[OrderEvent], rows: dict[str, IdemRow],
                  keys_of: Sequence[list[str]] | None = None) -> set[str]:
    """The orders T1 must read: those of events with a step not yet terminal."""
    needed = set()
    for index, event in enumerate(events):
        keys = keys_of[index] if keys_of is not None else step_keys(event)
        local = rows.get(keys[0])
        if local is None or (local.outcome == _APPLY and any(
                k not in rows or rows[k].status not in TERMINAL for k in keys[1:])):
            needed.add(event.order_no)
    return needed


def window_matters(events: Sequence[OrderEvent], keys_of: Sequence[list[str]], rows: Mapping[str, IdemRow],
                   verifiable: Mapping[str, float]) -> bool:
    """Whether a recovery window changes this batch's plan: it has a step of a verifiable effect
    that is not idempotent (the SMS) that ``t_idem`` has no row of, or holds pending. A store that
    went back in time may have forgotten a claim, or brought a row back older than what was done
    (pending, ``effect_not_delivered``, although a later claim sent it)."""
    if not verifiable:
        return False
    for event, keys in zip(events, keys_of):
        for step, key in zip(PIPELINES[event.type].effects, keys[1:]):
            if step.effect.name in verifiable:
                row = rows.get(key)
                if row is None or row.status is IdemStatus.PENDING:
                    return True
    return False




def plan_batch(events: Sequence[OrderEvent], rows: dict[str, IdemRow], orders: dict[str, Order],
               *, owner: str, tokens: Callable[[str], str],
               keys_of: Sequence[list[str]] | None = None,
               verifiable: Mapping[str, float] | None = None, contracts: Mapping[str, Contract] | None = None,
               attempt_cap: int | None = None, recovering: float | None = None,
               horizons: Mapping[str, float] | None = None, askable: Mapping[str, float] | None = None) -> BatchPlan:
    """Decide T1 for ``events`` (offset order) given the rows and orders read under lock.
    ``keys_of[i]`` may carry ``step_keys(events[i])`` when the caller has them already;
    ``verifiable`` maps the effects whose service can be asked whether a call happened to
    how long after an unknown outcome it is safe to ask; ``contracts`` the deployed providers'
    contracts by effect name (an effect without one is taken as ``none``: a call in doubt is for
    a person, the one reading that can never send twice). A pending row already claimed
    ``attempt_cap`` times is not claimed again (None: no cap, a person asked for the run).
    ``tokens(key)`` is a new claim's token (``app.pipeline.tokens``); a row keeps the one it has.
    ``recovering``: seconds since a recovery window opened (None: none is open). The store may
    have forgotten claims made before it, or brought rows back older, so a fresh claim or a
    pending row of a verifiable effect that is not idempotent (the SMS) is looked up before it
    is sent, as an unknown outcome is (:func:`effect_case`).
    ``horizons``: how long each effect's provider keeps keys (seconds; absent: for ever), ``askable``
    the effects whose client can look a call up (its settle seconds): a step whose first call is past
    its provider's horizon is asked about, or left to a person, never repeated blindly."""
    planner = _Planner(len(events), rows, orders, ClaimContext(
        owner=owner, tokens=tokens, verifiable=verifiable or {}, contracts=contracts or {}, attempt_cap=attempt_cap,
        recovering=recovering, horizons=horizons or {}, askable=askable or {}))
    plan_event = planner.event
    for index, event in enumerate(events):
        plan_event(index, event, keys_of[index] if keys_of is not None else step_keys(event))
    plan = planner.plan
    _drop_stale_jobs(plan, planner.current, rows)
    plan.superseding = {o for o, moved in plan.orders.items()      # moved on: not a stale step's facts
                        if o in orders and orders[o].has_dead_letters and moved.status != orders[o].status}
    if plan.superseding:
        plan.batch_keys = {(keys_of[i] if keys_of is not None else step_keys(e))[0]
                           for i, e in enumerate(events) if e.order_no in plan.superseding}
    return plan


class _Planner(EffectSteps):
    """One batch's T1 decision in the making: what the batch has changed so far
    (``current`` orders, the local keys seen, the orders ``blocked`` behind a retriable
    error); an event's own decisions here, its effect steps' in ``app.pipeline.effect_cases``."""

    __slots__ = ()

    def __init__(self, size: int, rows: dict[str, IdemRow], orders: dict[str, Order], claim: ClaimContext) -> None:
        self.plan = BatchPlan(events=[EventPlan() for _ in range(size)])
        self.rows = rows
        self.current = dict(orders)
        self.blocked = set()
        self.first_hash = {}
        # The claim's context, one attribute each: the planner reads them for every effect step.
        self.owner, self.tokens, self.attempt_cap, self.recovering = (
            claim.owner, claim.tokens, claim.attempt_cap, claim.recovering)
        self.verifiable, self.contracts, self.horizons, self.askable = (
            claim.verifiable, claim.contracts, claim.horizons, claim.askable)

    def event(self, index: int, event: OrderEvent, keys: list[str]) -> None:
        """One event, in offset order: its order's turn, its payload, its local step, its effects."""
        result = self.plan.events[index]
        if event.order_no in self.blocked:      # an earlier event of its order waits: so does this one
            result.deferred = True
            return
        if self._payload_clashes(result, event, keys):
            return
        pipe = PIPELINES[event.type]
        local = self._local_step(result, event, pipe.local, keys[0])
        if local is None:
            return
        local_outcome, fresh = local
        if not fresh and local_outcome != _APPLY:
            result.settled = local_outcome          # its first run found the order past it
        if local_outcome == _APPLY:
            rows, case_of, contracts = self.rows, effect_case, self.contracts
            for step, key in zip(pipe.effects, keys[1:]):
                row = rows.get(key)
                case = case_of(step.effect, row, contract=contracts.get(step.effect.name, Contract.NONE),
                               owner=self.owner, attempt_cap=self.attempt_cap, verifiable=self.verifiable,
                               recovering=self.recovering, horizons=self.horizons, askable=self.askable)
                if not CASE_ACTIONS[case](self, result, index, event, step, key, row):
                    break
        if result.error is None and not result.jobs:
            if fresh:
                assert local_outcome is not None    # this batch's own move: _local_step always names it
                result.outcome = _OUTCOME[local_outcome]
            else:
                result.outcome = _replayed(self.plan)

    # -- an event ---------------------------------------------------------------------------------

    def _payload_clashes(self, result: EventPlan, event: OrderEvent, keys: list[str]) -> bool:
        """Its keys recorded with another payload, or its request twice in this batch."""
        if self.rows:
            for k in keys:
                row = self.rows.get(k)
                if row is not None and row.payload_hash != event.payload_hash:
                    self.plan.claims["mismatch"] += 1
                    result.error = PayloadMismatch(
                        f"{row.biz_key} was recorded with payload {row.payload_hash[:12]}, this event carries "
                        f"{event.payload_hash[:12]}")
                    return True
        first = self.first_hash.get(keys[0])
        if first is None:
            self.first_hash[keys[0]] = event.payload_hash
            return False
        if first == event.payload_hash:
            result.outcome = Outcome.DUPLICATE
        else:
            result.error = PayloadMismatch(f"{keys[0]} arrived twice in one batch with different payloads")
        return True

    def _local_step(self, result: EventPlan, event: OrderEvent, step: LocalStep,
                    key: str) -> tuple[str | None, bool] | None:
        """(none) -> done, or done already: the local step's outcome and whether it is this
        batch's. None when the order is not ready for it (the order waits behind it)."""
        row = self.rows.get(key)
        plan = self.plan
        if row is not None:
            plan.claims["done"] += 1
            return row.outcome, False
        verdict = _apply_local(event, step, self.current, plan)
        if verdict is MoveVerdict.NOT_READY:
            state = self.current.get(event.order_no)
            result.error = PreconditionNotMet(
                f"{event.type.value} needs order {event.order_no} in an earlier state; it is "
                f"{state.status.name if state else 'unknown'}")
            self.blocked.add(event.order_no)
            return None
        outcome = _VERDICT_VALUE[verdict]
        plan.inserts.append(NewRow(key, event.part_date, step.name, IdemStatus.DONE, event.payload_hash,
                                   outcome=outcome))
        plan.claims["new"] += 1
        return outcome, True


def _replayed(plan: BatchPlan) -> Outcome:
    """An event whose every step t_idem holds as finished: delivered again."""
    plan.replayed += 1
    return Outcome.DUPLICATE


def _drop_stale_jobs(plan: BatchPlan, current: dict[str, Order], rows: dict[str, IdemRow]) -> None:
    """No call for an order that is in a state voiding the call by the end of this T1.

    The job's row is failed as ``stale`` instead: a fresh claim is inserted failed,
    a re-claim becomes a fenced pending -> failed. Its event ends ``stale``, not in error,
    unless an earlier attempt may have reached the service (its outcome is not "surely not
    delivered", or a recovery window makes the store's memory of it doubtful:
    ``EffectJob.earlier_unknown``): then a waybill may exist for a cancelled order, and the event
    goes to a person (``stale_effect_may_exist``) with the token to look for.
    """
    fresh = {row.biz_key: i for i, row in enumerate(plan.inserts) if row.status is IdemStatus.PENDING}
    reclaimed = {r.biz_key: r for r in plan.reclaims}
    for result in plan.events:
        stale = [job for job in result.jobs if current[job.order_no].status in job.voided_by]
        if not stale:
            continue
        for job in stale:
            message = (f"{job.biz_key}: not called, order {job.order_no} is "
                       f"{current[job.order_no].status.name}, past {job.target.name}")
            earlier = rows.get(job.biz_key)
            if job.biz_key in fresh:
                # A claim to be verified keeps its token: a claim the store forgot may have used it.
                i = fresh[job.biz_key]
                plan.inserts[i] = replace(plan.inserts[i], status=IdemStatus.FAILED, outcome=STALE,
                                          idem_token=job.token if job.earlier_unknown else None)
            else:
                plan.reclaims.remove(reclaimed[job.biz_key])
                plan.fails.append(FailRow(job.biz_key, job.part_date, job.attempt - 1, STALE, message))
            if job.earlier_unknown and result.error is None:
                before = (f"attempt {earlier.attempt} ended {earlier.outcome or 'without an outcome (its worker stopped)'}"
                          if earlier is not None and earlier.outcome != NOT_DELIVERED else
                          "a recovery window is open: a claim the store forgot, or a later state of this one,")
                result.error = StaleEffectMayExist(
                    f"{message}; but {before} may have reached the {job.effect.name} service: look for what it "
                    f"did under idempotency token {job.token} and undo it if it must not stand")
        result.jobs = [job for job in result.jobs if job not in stale]
        if result.error is None and not result.jobs:
            result.outcome = Outcome.STALE


def _apply_local(event: OrderEvent, step: LocalStep, current: dict[str, Order], plan: BatchPlan) -> MoveVerdict:
    """Move the order as ``step`` declares, copying its ``sets`` from the event."""
    order = current.get(event.order_no)
    verdict = judge_move(order.status if order else None, step.moves_order_to)
    if verdict is MoveVerdict.STALE and step.facts:
        assert order is not None            # judge_move says STALE only of an order at or past the target
        _record_facts(event, step, order, current, plan)
    if verdict is not MoveVerdict.APPLY:
        return verdict
    if order is None:
        order = Order(event.order_no, step.moves_order_to)
        plan.new_orders.add(event.order_no)
    moved = _moved(order, step.moves_order_to, step.sets, event.data)
    current[event.order_no] = plan.orders[event.order_no] = moved
    return verdict


def _moved(order: Order, status, sets: Mapping[str, str], data: Mapping) -> Order:
    """``replace(order, status=status, column=data[name] for each column: name in sets)``, without
    ``dataclasses.replace``'s walk over the fields: the order's values in one C call, then by position."""
    row = list(_ORDER_VALUES(order))
    row[_STATUS_AT] = status
    for column, name in sets.items():
        row[_ORDER_AT[column]] = data[name]
    return Order(*row)


def _record_facts(event: OrderEvent, step: LocalStep, order: Order, current: dict[str, Order],
                  plan: BatchPlan) -> None:
    """A stale step that declares facts still fills the order's empty fields; the status stays."""
    empty = {column: event.data[name] for column, name in step.sets.items() if getattr(order, column) is None}
    if empty:
        current[event.order_no] = plan.orders[event.order_no] = replace(order, **empty)
