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

An effect is only ever called for an order still at its step's target: once
the order has moved past it (a CONFIRM's waybill when a CANCEL came after),
the effect row is failed as ``stale`` without a call, whether it is claimed
for the first time or again (the effect form of "a cancelled order got
confirmed again").
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Callable, Mapping, Sequence

from app.pipeline.errors import (AttemptsExhausted, EffectOutcomeUnknown, LeaseHeld, PayloadMismatch, PipelineError,
                                 StaleEffectMayExist,
                                 PreconditionNotMet, UnknownOutcomeNonIdempotent)
from app.pipeline.events import OrderEvent
from app.pipeline.model import (NOT_DELIVERED, SETTLED_FAILURES, STALE, BatchPlan, EffectJob, EventPlan, FailRow,
                                IdemRow, NewRow, Reclaim)
from app.pipeline.outcomes import Outcome
from app.pipeline.states import TERMINAL, IdemStatus, MoveVerdict, Order, judge_move
from app.pipeline.steps import PIPELINES, Effect, LocalStep

_APPLY = MoveVerdict.APPLY.value
_VERDICT_VALUE = {verdict: verdict.value for verdict in MoveVerdict}
_OUTCOME = {outcome.value: outcome for outcome in Outcome}      # Outcome(value), without Enum's call
_ORDER_FIELDS = tuple(f.name for f in fields(Order))


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


def fresh_verifiable(events: Sequence[OrderEvent], keys_of: Sequence[list[str]], rows: Mapping[str, IdemRow],
                     verifiable: Mapping[str, float]) -> bool:
    """Whether a recovery window changes this batch's plan: it has a step of a verifiable effect
    that is not idempotent (the SMS) and that ``t_idem`` has no row of."""
    if not verifiable:
        return False
    return any(key not in rows and step.effect.name in verifiable and not step.effect.idempotent
               for event, keys in zip(events, keys_of)
               for step, key in zip(PIPELINES[event.type].effects, keys[1:]))


def plan_batch(events: Sequence[OrderEvent], rows: dict[str, IdemRow], orders: dict[str, Order],
               *, owner: str, tokens: Callable[[str], str],
               keys_of: Sequence[list[str]] | None = None,
               verifiable: Mapping[str, float] | None = None,
               attempt_cap: int | None = None, recovering: float | None = None) -> BatchPlan:
    """Decide T1 for ``events`` (offset order) given the rows and orders read under lock.
    ``keys_of[i]`` may carry ``step_keys(events[i])`` when the caller has them already;
    ``verifiable`` maps the effects whose service can be asked whether a call happened to
    how long after an unknown outcome it is safe to ask. A pending row already claimed
    ``attempt_cap`` times is not claimed again (None: no cap, a person asked for the run).
    ``tokens(key)`` is a new claim's token (``app.pipeline.tokens``); a row keeps the one it has.
    ``recovering``: seconds since a recovery window opened (None: none is open). The store may
    have forgotten claims made before it, so a fresh claim of a verifiable effect that is not
    idempotent (the SMS) is looked up before it is sent, as an unknown outcome is."""
    verifiable = verifiable or {}
    plan = BatchPlan(events=[EventPlan() for _ in events])
    claims = plan.claims
    current = dict(orders)
    blocked: set[str] = set()
    first_hash: dict[str, str] = {}     # local key -> payload hash of its first event in this batch

    for index, event in enumerate(events):
        result = plan.events[index]
        if event.order_no in blocked:
            result.deferred = True
            continue
        pipe = PIPELINES[event.type]
        keys = keys_of[index] if keys_of is not None else step_keys(event)
        local_key = keys[0]

        clash = None
        if rows:
            for k in keys:
                row = rows.get(k)
                if row is not None and row.payload_hash != event.payload_hash:
                    clash = row
                    break
        if clash is not None:
            claims["mismatch"] += 1
            result.error = PayloadMismatch(
                f"{clash.biz_key} was recorded with payload {clash.payload_hash[:12]}, this event carries "
                f"{event.payload_hash[:12]}")
            continue
        if local_key in first_hash:     # the same request twice in one batch
            if first_hash[local_key] == event.payload_hash:
                result.outcome = Outcome.DUPLICATE
            else:
                result.error = PayloadMismatch(f"{local_key} arrived twice in one batch with different payloads")
            continue
        first_hash[local_key] = event.payload_hash

        local_row = rows.get(local_key)
        if local_row is None:
            verdict = _apply_local(event, pipe.local, current, plan)
            if verdict is MoveVerdict.NOT_READY:
                state = current.get(event.order_no)
                result.error = PreconditionNotMet(
                    f"{event.type.value} needs order {event.order_no} in an earlier state; it is "
                    f"{state.status.name if state else 'unknown'}")
                blocked.add(event.order_no)
                continue
            plan.inserts.append(NewRow(local_key, event.part_date, pipe.local.name, IdemStatus.DONE,
                                       event.payload_hash, outcome=_VERDICT_VALUE[verdict]))
            claims["new"] += 1
            local_outcome, fresh = _VERDICT_VALUE[verdict], True
        else:
            claims["done"] += 1
            local_outcome, fresh = local_row.outcome, False

        if local_outcome != _APPLY:
            result.outcome = _OUTCOME[local_outcome] if fresh else _replayed(plan)
            continue

        for step, key in zip(pipe.effects, keys[1:]):
            row = rows.get(key)
            if row is not None and row.status is IdemStatus.DONE:
                claims["done"] += 1
                continue
            if row is not None and row.status is IdemStatus.FAILED:
                claims["failed"] += 1
                if row.outcome in SETTLED_FAILURES:   # settled: its order moved on, or a person settled it
                    continue
                result.error = _terminal_error(row)
                break
            order = current[event.order_no]
            recheck = False
            if row is None and recovering is not None and step.effect.name in verifiable \
                    and not step.effect.idempotent:
                if recovering < verifiable[step.effect.name]:
                    # A request of the forgotten claim may still be on its way to the service.
                    wait = verifiable[step.effect.name] - recovering
                    claims["waiting"] += 1
                    result.error = EffectOutcomeUnknown(
                        f"{key}: a recovery window is open (the store may have forgotten an earlier claim); "
                        f"the service is asked once {verifiable[step.effect.name]:g}s have passed since it "
                        f"opened, in {wait:.0f}s")
                    blocked.add(event.order_no)
                    break
                recheck = True
            if row is None:
                claims["new"] += 1
                token, attempt = tokens(key), 1
                plan.inserts.append(NewRow(key, event.part_date, step.name, IdemStatus.PENDING,
                                           event.payload_hash, idem_token=token))
            elif not (row.expired or row.owner == owner):
                claims["held"] += 1
                result.error = LeaseHeld(f"{key} is claimed by {row.owner} for {row.remaining:.1f}s more",
                                         wait_seconds=row.remaining)
                blocked.add(event.order_no)
                break
            elif attempt_cap is not None and row.attempt >= attempt_cap:
                # Claimed this often without an end: something keeps failing it. A person decides.
                claims["capped"] += 1
                result.error = AttemptsExhausted(
                    f"{key} was claimed {row.attempt} times without finishing (IDEM_MAX_ATTEMPTS={attempt_cap}): "
                    "it is not claimed again automatically; retry it from the compensation console once the "
                    "cause is fixed")
                blocked.add(event.order_no)
                break
            elif _outcome_unknown(step.effect, row) and step.effect.name in verifiable \
                    and row.since_call < verifiable[step.effect.name]:
                # Asking the service now could miss a request still on its way to it.
                wait = verifiable[step.effect.name] - row.since_call
                claims["waiting"] += 1
                result.error = EffectOutcomeUnknown(
                    f"{key}: the outcome of attempt {row.attempt} is unknown; the service is asked once "
                    f"{verifiable[step.effect.name]:g}s have passed, in {wait:.0f}s")
                blocked.add(event.order_no)
                break
            elif _outcome_unknown(step.effect, row) and step.effect.name not in verifiable:
                # An earlier claim may have reached the gateway: calling again could send twice,
                # and the service cannot be asked.
                message = (f"{key}: attempt {row.attempt} of a call without idempotency key ended "
                           "without a known outcome")
                claims["failed"] += 1
                plan.fails.append(FailRow(key, event.part_date, row.attempt,
                                          UnknownOutcomeNonIdempotent.reason, message))
                result.error = UnknownOutcomeNonIdempotent(message)
                break
            else:
                # Claimed again; a call whose outcome is unknown is looked up before it is repeated.
                claims["reclaimed"] += 1
                token, attempt = row.idem_token or tokens(key), row.attempt + 1
                plan.reclaims.append(Reclaim(key, event.part_date, row.attempt))
            result.jobs.append(EffectJob(index, event.order_no, key, event.part_date, step.name, step.effect,
                                         token, attempt, step.effect.request(event, order),
                                         pipe.local.moves_order_to,
                                         verify=recheck or (row is not None and _outcome_unknown(step.effect, row)),
                                         earlier_unknown=row is not None and row.outcome != NOT_DELIVERED))
        if result.error is None and not result.jobs:
            result.outcome = _OUTCOME[local_outcome] if fresh else _replayed(plan)
    _drop_stale_jobs(plan, current, rows)
    plan.superseding = {o for o, moved in plan.orders.items()      # moved on: not a stale step's facts
                        if o in orders and orders[o].has_dead_letters and moved.status != orders[o].status}
    if plan.superseding:
        plan.batch_keys = {(keys_of[i] if keys_of is not None else step_keys(e))[0]
                           for i, e in enumerate(events) if e.order_no in plan.superseding}
    return plan


def _replayed(plan: BatchPlan) -> Outcome:
    """An event whose every step t_idem holds as finished: delivered again."""
    plan.replayed += 1
    return Outcome.DUPLICATE


def _drop_stale_jobs(plan: BatchPlan, current: dict[str, Order], rows: dict[str, IdemRow]) -> None:
    """No call for an order that has moved past the call's target by the end of this T1.

    The job's row is failed as ``stale`` instead: a fresh claim is inserted failed,
    a re-claim becomes a fenced pending -> failed. Its event ends ``stale``, not in error,
    unless an earlier attempt may have reached the service (its outcome is not "surely not
    delivered"): then a waybill may exist for a cancelled order, and the event goes to a
    person (``stale_effect_may_exist``) with the token to look for.
    """
    fresh = {row.biz_key: i for i, row in enumerate(plan.inserts) if row.status is IdemStatus.PENDING}
    reclaimed = {r.biz_key: r for r in plan.reclaims}
    for result in plan.events:
        stale = [job for job in result.jobs if current[job.order_no].status > job.target]
        if not stale:
            continue
        for job in stale:
            message = (f"{job.biz_key}: not called, order {job.order_no} is "
                       f"{current[job.order_no].status.name}, past {job.target.name}")
            if job.biz_key in fresh:
                i = fresh[job.biz_key]
                plan.inserts[i] = replace(plan.inserts[i], status=IdemStatus.FAILED, idem_token=None, outcome=STALE)
            else:
                plan.reclaims.remove(reclaimed[job.biz_key])
                plan.fails.append(FailRow(job.biz_key, job.part_date, job.attempt - 1, STALE, message))
                earlier = rows[job.biz_key]
                if earlier.outcome != NOT_DELIVERED and result.error is None:
                    result.error = StaleEffectMayExist(
                        f"{message}; but attempt {earlier.attempt} ended "
                        f"{earlier.outcome or 'without an outcome (its worker stopped)'} and may have reached the "
                        f"{job.effect.name} service: look for what it did under idempotency token {job.token} "
                        "and undo it if it must not stand")
        result.jobs = [job for job in result.jobs if job not in stale]
        if result.error is None and not result.jobs:
            result.outcome = Outcome.STALE


def _apply_local(event: OrderEvent, step: LocalStep, current: dict[str, Order], plan: BatchPlan) -> MoveVerdict:
    """Move the order as ``step`` declares, copying its ``sets`` from the event."""
    order = current.get(event.order_no)
    verdict = judge_move(order.status if order else None, step.moves_order_to)
    if verdict is MoveVerdict.STALE and step.facts:
        _record_facts(event, step, order, current, plan)
    if verdict is not MoveVerdict.APPLY:
        return verdict
    if order is None:
        order = Order(event.order_no, step.moves_order_to)
        plan.new_orders.add(event.order_no)
    moved = _moved(order, step.moves_order_to, {column: event.data[name] for column, name in step.sets.items()})
    current[event.order_no] = plan.orders[event.order_no] = moved
    return verdict


def _moved(order: Order, status, values: dict) -> Order:
    """``replace(order, status=status, **values)`` without ``dataclasses.replace``'s field walk."""
    current = {name: getattr(order, name) for name in _ORDER_FIELDS}
    current["status"] = status
    current.update(values)
    return Order(**current)


def _record_facts(event: OrderEvent, step: LocalStep, order: Order, current: dict[str, Order],
                  plan: BatchPlan) -> None:
    """A stale step that declares facts still fills the order's empty fields; the status stays."""
    empty = {column: event.data[name] for column, name in step.sets.items() if getattr(order, column) is None}
    if empty:
        current[event.order_no] = plan.orders[event.order_no] = replace(order, **empty)


def _outcome_unknown(effect: Effect, row: IdemRow) -> bool:
    """An earlier claim of a non-idempotent effect may have reached its service."""
    return not effect.idempotent and row.outcome != NOT_DELIVERED


def _terminal_error(row: IdemRow) -> PipelineError:
    """The error that failed a row for good, rebuilt so a replay dead-letters it again."""
    return PipelineError(row.last_err or f"{row.biz_key} failed earlier", reason=row.outcome or "failed")
