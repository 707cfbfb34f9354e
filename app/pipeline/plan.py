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
from enum import Enum
from operator import attrgetter

from app.pipeline import horizon
from app.pipeline.errors import (
    AttemptsExhausted,
    KeyHorizonPassed,
    LeaseHeld,
    NotAskableYet,
    PayloadMismatch,
    PipelineError,
    PreconditionNotMet,
    StaleEffectMayExist,
    UnknownOutcomeNonIdempotent,
)
from app.pipeline.events import OrderEvent
from app.pipeline.model import (
    NOT_DELIVERED,
    SETTLED_FAILURES,
    STALE,
    BatchPlan,
    EffectJob,
    EventPlan,
    FailRow,
    IdemRow,
    NewRow,
    Reclaim,
)
from app.pipeline.outcomes import Outcome
from app.pipeline.states import TERMINAL, IdemStatus, MoveVerdict, Order, judge_move
from app.pipeline.steps import PIPELINES, Contract, Effect, LocalStep

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


class EffectCase(Enum):
    """What T1 does with one effect step, by what ``t_idem`` holds of it: the ``t_idem``
    table of the docs' exactly-once page, row by row, with the waits and refusals that keep a call from
    happening twice. :func:`effect_case` picks one; ``_Planner`` has one method for each."""

    DONE = "done"                            # done: nothing left to do
    SETTLED = "settled"                      # failed, settled (stale, or a person's decision): nothing to do
    FAILED = "failed"                        # failed for good: the event dead-letters again
    CLAIM = "claim"                          # (none) -> pending: attempt 1, a new token
    CLAIM_LOOKED_UP = "claim_looked_up"      # the same in a recovery window, the service asked before the call
    RECOVERY_WAIT = "recovery_wait"          # (none) or pending, in a recovery window too young to ask the service
    HELD = "held"                            # pending, another claimant's live lease: wait for it
    CAPPED = "capped"                        # pending, claimed IDEM_MAX_ATTEMPTS times: a person decides
    UNKNOWN_WAIT = "unknown_wait"            # pending, last call's outcome unknown, too early to ask: wait
    UNKNOWN_UNASKABLE = "unknown_unaskable"  # pending, last call's outcome unknown, no way to ask: failed
    RECLAIM = "reclaim"                      # pending -> pending: attempt + 1, the same token
    RECLAIM_LOOKED_UP = "reclaim_looked_up"  # the same, the last call's outcome unknown or a recovery window
                                             # open, or its first call past the provider's key horizon: asked
                                             # before calling
    PAST_HORIZON = "past_horizon"            # pending, an earlier call may have reached a provider that no
                                             # longer keeps its key, which cannot be asked: a person decides


def effect_case(effect: Effect, row: IdemRow | None, *, contract: Contract, owner: str, attempt_cap: int | None,
                verifiable: Mapping[str, float], recovering: float | None,
                horizons: Mapping[str, float] | None = None, askable: Mapping[str, float] | None = None) -> EffectCase:
    """The case of one effect step: a pure function of its row and the claim's context.
    The order the questions come in is the rule: a live lease is respected before the cap,
    the cap before an unknown outcome.

    While a recovery window is open (``recovering``: its age), the store may have forgotten a
    claim of a verifiable effect that is not idempotent (the SMS), or brought its row back older
    than what was done: a fresh claim and every pending row of it are looked up before any call,
    once the window is older than the service's settle time.

    A provider keeps a key for a while only (``horizons``: seconds, by effect; an effect not in it
    keeps them for ever). Once the first call that may have reached it is older than that, a repeat
    is no replay: the call is in doubt, asked about where the provider has a lookup (``askable``:
    its settle seconds), for a person where it has none."""
    # How long after a call of this effect its service can be asked; None: no second call can
    # be told from the first (its provider replays or refuses a repeated call itself), or none can
    # be asked (the deployed provider's contract has no lookup).
    delay = verifiable.get(effect.name) if contract.verifiable else None
    windowed = recovering is not None and delay is not None
    if row is None:
        if recovering is None or delay is None:     # not windowed
            return EffectCase.CLAIM
        return EffectCase.RECOVERY_WAIT if recovering < delay else EffectCase.CLAIM_LOOKED_UP
    status = row.status
    if status is IdemStatus.DONE:
        return EffectCase.DONE
    if status is IdemStatus.FAILED:
        return EffectCase.SETTLED if row.outcome in SETTLED_FAILURES else EffectCase.FAILED
    if not (row.expired or row.owner == owner):
        return EffectCase.HELD
    if attempt_cap is not None and row.attempt >= attempt_cap:
        return EffectCase.CAPPED
    unknown = _outcome_unknown(contract, row)
    forgotten = horizons is not None and horizon.past_horizon(row, horizons.get(effect.name))
    if not (unknown or windowed or forgotten):
        return EffectCase.RECLAIM
    if forgotten and contract.idempotent:
        # Its repeat would be new to the provider: the lookup decides, or a person.
        ask = askable.get(effect.name) if askable is not None else None
        if ask is None:
            return EffectCase.PAST_HORIZON
        return EffectCase.UNKNOWN_WAIT if row.since_call < ask else EffectCase.RECLAIM_LOOKED_UP
    if delay is None:
        return EffectCase.UNKNOWN_UNASKABLE
    if recovering is not None and recovering < delay:   # windowed (delay is set here)
        return EffectCase.RECOVERY_WAIT
    return EffectCase.UNKNOWN_WAIT if unknown and row.since_call < delay else EffectCase.RECLAIM_LOOKED_UP


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
    planner = _Planner(len(events), rows, orders, owner=owner, tokens=tokens, verifiable=verifiable or {},
                       contracts=contracts or {}, attempt_cap=attempt_cap, recovering=recovering,
                       horizons=horizons or {}, askable=askable or {})
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


class _Planner:
    """One batch's T1 decision in the making: what the batch has changed so far
    (``current`` orders, the local keys seen, the orders ``blocked`` behind a retriable
    error) and one method for each case of an event and of its effect steps."""

    __slots__ = ("plan", "rows", "current", "blocked", "first_hash", "owner", "tokens", "verifiable",
                 "contracts", "attempt_cap", "recovering", "horizons", "askable")

    def __init__(self, size: int, rows: dict[str, IdemRow], orders: dict[str, Order], *, owner: str,
                 tokens: Callable[[str], str], verifiable: Mapping[str, float],
                 contracts: Mapping[str, Contract], attempt_cap: int | None, recovering: float | None,
                 horizons: Mapping[str, float], askable: Mapping[str, float]) -> None:
        self.plan = BatchPlan(events=[EventPlan() for _ in range(size)])
        self.rows = rows
        self.current = dict(orders)
        self.blocked: set[str] = set()
        self.first_hash: dict[str, str] = {}    # local key -> payload hash of its first event in this batch
        self.owner, self.tokens, self.verifiable, self.contracts = owner, tokens, verifiable, contracts
        self.attempt_cap, self.recovering = attempt_cap, recovering
        self.horizons, self.askable = horizons, askable

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
                if not _CASE_ACTIONS[case](self, result, index, event, step, key, row):
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

    # -- an effect step, one method per EffectCase: True goes on to the event's next step -------------

    def _done(self, result, index, event, step, key, row) -> bool:
        self.plan.claims["done"] += 1
        return True

    def _settled(self, result, index, event, step, key, row) -> bool:
        self.plan.claims["failed"] += 1
        result.settled = result.settled or row.outcome
        return True

    def _failed(self, result, index, event, step, key, row) -> bool:
        self.plan.claims["failed"] += 1
        result.error = _terminal_error(row)
        return False

    def _claim(self, result, index, event, step, key, row) -> bool:
        self._take_new(result, index, event, step, key, verify=False)
        return True

    def _claim_looked_up(self, result, index, event, step, key, row) -> bool:
        # The store may have forgotten an earlier claim: the service is asked before the call.
        self._take_new(result, index, event, step, key, verify=True)
        return True

    def _recovery_wait(self, result, index, event, step, key, row) -> bool:
        # A request of a claim the store forgot may still be on its way to the service.
        delay, recovering = self._settle(step.effect.name), self.recovering
        assert recovering is not None       # effect_case gives RECOVERY_WAIT only in an open window
        return self._wait(result, event, NotAskableYet(
            f"{key}: a recovery window is open (the store may have forgotten an earlier claim, or hold an older "
            f"state of this one); the service is asked once {delay:g}s have passed since it opened, in "
            f"{delay - recovering:.0f}s", wait_seconds=delay - recovering))

    def _held(self, result, index, event, step, key, row) -> bool:
        self.plan.claims["held"] += 1
        result.error = LeaseHeld(f"{key} is claimed by {row.owner} for {row.remaining:.1f}s more",
                                 wait_seconds=row.remaining)
        self.blocked.add(event.order_no)
        return False

    def _capped(self, result, index, event, step, key, row) -> bool:
        # Claimed this often without an end: something keeps failing it. A person decides.
        self.plan.claims["capped"] += 1
        result.error = AttemptsExhausted(
            f"{key} was claimed {row.attempt} times without finishing (IDEM_MAX_ATTEMPTS={self.attempt_cap}): "
            "it is not claimed again automatically; retry it from the compensation console once the "
            "cause is fixed")
        self.blocked.add(event.order_no)
        return False

    def _unknown_wait(self, result, index, event, step, key, row) -> bool:
        # Asking the service now could miss a request still on its way to it.
        delay = self._settle(step.effect.name)
        wait = max(delay - row.since_call, delay - self.recovering if self.recovering is not None else 0.0)
        why = f"the outcome of attempt {row.attempt} is unknown"
        if horizon.past_horizon(row, self.horizons.get(step.effect.name)):
            why = f"its first call is older than its provider keeps keys ({horizon.span(self.horizons[step.effect.name])})"
        return self._wait(result, event, NotAskableYet(
            f"{key}: {why}; the service is asked once {delay:g}s have passed, in {wait:.0f}s", wait_seconds=wait))

    def _unknown_unaskable(self, result, index, event, step, key, row) -> bool:
        # An earlier claim may have reached the gateway: calling again could send twice,
        # and the service cannot be asked.
        message = f"{key}: attempt {row.attempt} of a call without idempotency key ended without a known outcome"
        self.plan.claims["failed"] += 1
        self.plan.fails.append(FailRow(key, event.part_date, row.attempt, UnknownOutcomeNonIdempotent.reason,
                                       message))
        result.error = UnknownOutcomeNonIdempotent(message)
        return False

    def _reclaim(self, result, index, event, step, key, row) -> bool:
        self._take_again(result, index, event, step, key, row, verify=False)
        return True

    def _reclaim_looked_up(self, result, index, event, step, key, row) -> bool:
        # The last call's outcome is unknown, or the store may hold an older state of the row
        # (a recovery window), or the provider may have forgotten the key: the service is asked
        # before it is repeated; in the last case, a lookup that finds nothing repeats nothing.
        forgotten = horizon.past_horizon(row, self.horizons.get(step.effect.name))
        self._take_again(result, index, event, step, key, row, verify=True,
                         past=self._horizon_facts(step, row) if forgotten else None)
        return True

    def _past_horizon(self, result, index, event, step, key, row) -> bool:
        # Repeated, the key would be new to the provider: a second effect, not a replay. Nothing is
        # claimed (the row stays as it is, for a person to look up and settle, or adopt).
        self.plan.claims["past_horizon"] += 1
        result.error = KeyHorizonPassed(
            f"{key}: not called: {self._horizon_facts(step, row)}, and it has no lookup to ask. "
            f"{horizon.what_to_check(event.order_no, row)}")
        self.blocked.add(event.order_no)
        return False

    # -- what the cases share -----------------------------------------------------------------------

    def _wait(self, result: EventPlan, event: OrderEvent, error: NotAskableYet) -> bool:
        self.plan.claims["waiting"] += 1
        result.error = error
        self.blocked.add(event.order_no)
        return False

    # A claim made to be verified stays "verify first" until it is verified: when its call is not
    # made (too little lease left, an earlier call of its order failed), its row must not say
    # "not delivered", or the next claim would send without asking, although the claim the
    # store forgot may have sent it under the same token (``earlier_unknown``).

    def _take_new(self, result, index, event, step, key, *, verify: bool) -> None:
        token = self.tokens(key)
        self.plan.claims["new"] += 1
        self.plan.inserts.append(NewRow(key, event.part_date, step.name, IdemStatus.PENDING, event.payload_hash,
                                        idem_token=token))
        self._job(result, index, event, step, key, token, 1, verify=verify, earlier_unknown=verify)

    def _take_again(self, result, index, event, step, key, row: IdemRow, *, verify: bool,
                    past: str | None = None) -> None:
        self.plan.claims["reclaimed"] += 1
        self.plan.reclaims.append(Reclaim(key, event.part_date, row.attempt))
        self._job(result, index, event, step, key, row.idem_token or self.tokens(key), row.attempt + 1,
                  verify=verify, earlier_unknown=verify or row.outcome != NOT_DELIVERED, past_horizon=past)

    def _job(self, result: EventPlan, index: int, event: OrderEvent, step, key: str, token: str, attempt: int,
             *, verify: bool, earlier_unknown: bool, past_horizon: str | None = None) -> None:
        pipe = PIPELINES[event.type]
        result.jobs.append(EffectJob(index, event.order_no, key, event.part_date, step.name, step.effect, token,
                                     attempt, step.effect.request(event, self.current[event.order_no]),
                                     pipe.local.moves_order_to, step.voids(pipe.local.moves_order_to),
                                     verify=verify, earlier_unknown=earlier_unknown, past_horizon=past_horizon))

    def _settle(self, effect: str) -> float:
        """How long after a call of ``effect`` its service may be asked about it."""
        delay = self.verifiable.get(effect)
        return self.askable[effect] if delay is None else delay

    def _horizon_facts(self, step, row: IdemRow) -> str:
        return horizon.facts(step.effect.name, row, self.horizons[step.effect.name])


_CASE_ACTIONS = {case: getattr(_Planner, "_" + case.value) for case in EffectCase}


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


def _outcome_unknown(contract: Contract, row: IdemRow) -> bool:
    """An earlier claim of a non-idempotent effect may have reached its service."""
    return not contract.idempotent and row.outcome != NOT_DELIVERED


def _terminal_error(row: IdemRow) -> PipelineError:
    """The error that failed a row for good, rebuilt so a replay dead-letters it again."""
    return PipelineError(row.last_err or f"{row.biz_key} failed earlier", reason=row.outcome or "failed")
