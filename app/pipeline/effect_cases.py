"""What T1 does with one effect step: its case, by what ``t_idem`` holds of it (the ``t_idem``
table of the docs' exactly-once page, row by row), and what each case writes into the plan.

:func:`effect_case` is a pure function of the step's row and the claim's context; :class:`EffectSteps`
has one method for each case (``CASE_ACTIONS``), the base of T1's planner (``app.pipeline.plan``),
whose state they share: the plan in the making, the orders as this batch has moved them so far and
the orders blocked behind a retriable error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from app.pipeline import horizon
from app.pipeline.errors import (
    AttemptsExhausted,
    KeyHorizonPassed,
    LeaseHeld,
    NotAskableYet,
    PipelineError,
    UnknownOutcomeNonIdempotent,
)
from app.pipeline.events import OrderEvent
from app.pipeline.model import (
    NOT_DELIVERED,
    SETTLED_FAILURES,
    BatchPlan,
    EffectJob,
    EventPlan,
    FailRow,
    IdemRow,
    NewRow,
    Reclaim,
)
from app.pipeline.states import IdemStatus, Order
from app.pipeline.steps import PIPELINES, Contract, Effect


class EffectCase(Enum):
    """What T1 does with one effect step, by what ``t_idem`` holds of it: the ``t_idem``
    table of the docs' exactly-once page, row by row, with the waits and refusals that keep a call from
    happening twice. :func:`effect_case` picks one; :class:`EffectSteps` has one method for each."""

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

@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimContext:
    """What the claims of one T1 are made with (``plan_batch``'s keywords)."""

    owner: str
    tokens: Callable[[str], str]        # a new claim's token, from its key
    verifiable: Mapping[str, float]     # effects whose service can be asked about a call: after how long
    contracts: Mapping[str, Contract]   # the deployed providers' contracts, by effect
    attempt_cap: int | None             # claims of a key before a person must decide (None: no cap)
    recovering: float | None            # seconds since a recovery window opened (None: none is open)
    horizons: Mapping[str, float]       # how long each effect's provider keeps keys
    askable: Mapping[str, float]        # effects whose client can look a call up: its settle seconds


class EffectSteps:
    """One batch's T1 decision in the making, as its effect steps see it (``app.pipeline.plan``'s
    planner is one): the ``plan``, the orders as the batch has moved them so far (``current``), the
    orders ``blocked`` behind a retriable error, and the claim's context."""

    __slots__ = ("plan", "rows", "current", "blocked", "first_hash", "owner", "tokens", "verifiable",
                 "contracts", "attempt_cap", "recovering", "horizons", "askable")

    plan: BatchPlan
    rows: dict[str, IdemRow]
    current: dict[str, Order]
    blocked: set[str]
    first_hash: dict[str, str]          # local key -> payload hash of its first event in this batch
    owner: str
    tokens: Callable[[str], str]
    verifiable: Mapping[str, float]
    contracts: Mapping[str, Contract]
    attempt_cap: int | None
    recovering: float | None
    horizons: Mapping[str, float]
    askable: Mapping[str, float]

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


CASE_ACTIONS = {case: getattr(EffectSteps, "_" + case.value) for case in EffectCase}


def _outcome_unknown(contract: Contract, row: IdemRow) -> bool:
    """An earlier claim of a non-idempotent effect may have reached its service."""
    return not contract.idempotent and row.outcome != NOT_DELIVERED


def _terminal_error(row: IdemRow) -> PipelineError:
    """The error that failed a row for good, rebuilt so a replay dead-letters it again."""
    return PipelineError(row.last_err or f"{row.biz_key} failed earlier", reason=row.outcome or "failed")
