"""What each event type does, declared as data.

An event type runs one *local step*, then its *effect steps*; each step has an
idempotency key of its own, so a replay resumes at the first step not yet done.

* A **local step** moves the order to a state and copies fields of the event
  onto it (``sets``: order field <- event data field). It runs in the first
  transaction, with its claim.
* An **effect step** calls an external service, outside any transaction, with
  a token persisted when it was claimed. What it calls is an :class:`Effect`:
  its name (the provider module registered under that name makes the call, see
  ``app.adapters.effects``), how its request is built from the event and the
  order, what ``t_idem`` records when it is done, and which fields its receipt
  holds besides its reference. An effect whose receipt has a table of its own
  also has a receipt writer, registered under the same name
  (``app.adapters.mysql.receipts``).

What the provider does with a call made twice is its :class:`Contract`, declared by the
provider's module (the deployment chooses the provider, and the SMS gateway's contract is
``lookup`` or ``none`` as the deployed gateway offers its lookup or not); the pipeline's
decisions about a call in doubt read it from the ``EffectClient`` port, never from the
effect's name.

A new event type is one line in :data:`PIPELINES` (and its data fields in
``app.pipeline.events``); a new effect is one :class:`Effect` here, used by a step, plus its
provider's module (the docs' Architecture page).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from typing import Any

from app.pipeline.events import EventType, OrderEvent
from app.pipeline.states import Order, OrderStatus

DEFAULT_KEY_FORMAT = "{order_no}:{type}:{step}"


class Contract(Enum):
    """What the provider behind an effect does with a call made twice: the pipeline's decisions
    about a call whose outcome is in doubt follow from it, never from the effect's name."""

    # A repeated idempotency key answers with the first call's result (today's logistics API):
    # a call in doubt is made again with its token.
    REPLAYS = "replays"
    # A repeated reference is refused with a duplicate error; the client then looks the first
    # call's result up by that reference and settles with it: a call in doubt is made again.
    REFUSES_DUPLICATES = "refuses_duplicates"
    # No key; the provider can be asked whether a call arrived (today's SMS gateway, lookup by
    # ``client_ref``): a call in doubt is asked about before any second call. A gateway deployed
    # without its lookup (``SMS_LOOKUP=false``) is ``NONE``.
    LOOKUP = "lookup"
    # Neither: the outcome of a call in doubt is for a person.
    NONE = "none"

    @property
    def idempotent(self) -> bool:
        """A second call with the same token makes no second effect: the provider replays the first
        answer or refuses the duplicate (and the client looks the first up)."""
        return self in (Contract.REPLAYS, Contract.REFUSES_DUPLICATES)

    @property
    def verifiable(self) -> bool:
        """The provider can be asked whether a call arrived."""
        return self is Contract.LOOKUP


@dataclass(frozen=True, slots=True)
class Effect:
    name: str
    request: Callable[[OrderEvent, Order], dict[str, Any]] = field(repr=False)
    done: str                                           # t_idem.outcome once the call succeeded
    receipt_fields: tuple[str, ...] = ()                # the receipt's own fields, beside its reference


ISSUE_WAYBILL = Effect(
    "waybill", done="waybill_issued",
    request=lambda event, order: {"order_no": order.order_no, "address": order.address})
SEND_SMS = Effect(
    "sms", done="sms_accepted",
    request=lambda event, order: {"phone": order.phone,
                                  "text": f"Order {order.order_no} was cancelled: {event.data['reason']}"})


@dataclass(frozen=True, slots=True)
class LocalStep:
    name: str
    moves_order_to: OrderStatus
    sets: Mapping[str, str] = field(default_factory=dict)   # order field <- event data field
    # Facts: ``sets`` are recorded even when the move is stale, into fields still empty (the
    # first value stands). A payment that arrives after its order was cancelled moves nothing,
    # but the order must show it was paid, or nobody refunds it.
    facts: bool = False


@dataclass(frozen=True, slots=True)
class EffectStep:
    name: str
    effect: Effect
    # The order states in which the call no longer stands: it is failed ``stale``, never made.
    # None is every state ranked past the step's target (a CONFIRM's waybill once the order is
    # CANCELLED). A step names them when a state past its target must not void it (a SHIPPED
    # state after CONFIRMED: a shipped order still needs its waybill).
    voided_by: frozenset[OrderStatus] | None = None

    def voids(self, target: OrderStatus) -> frozenset[OrderStatus]:
        """The states that void this step, whose event moves the order to ``target``."""
        return _voiding(self.voided_by, target)


@cache
def _voiding(voided_by: frozenset[OrderStatus] | None, target: OrderStatus) -> frozenset[OrderStatus]:
    return voided_by if voided_by is not None else frozenset(s for s in OrderStatus if s > target)


@dataclass(frozen=True, slots=True)
class Pipeline:
    local: LocalStep
    effects: tuple[EffectStep, ...] = ()
    key_format: str = DEFAULT_KEY_FORMAT

    def key(self, event: OrderEvent, step: LocalStep | EffectStep) -> str:
        if self.key_format == DEFAULT_KEY_FORMAT:      # the common case, without str.format's parsing
            return f"{event.order_no}:{event.type.value}:{step.name}"
        return self.key_format.format(order_no=event.order_no, type=event.type.value, step=step.name)


PIPELINES: Mapping[EventType, Pipeline] = {
    EventType.CREATED: Pipeline(LocalStep("create_order", OrderStatus.CREATED,
                                          sets={"amount_cents": "amount_cents", "phone": "phone",
                                                "address": "address"})),
    EventType.PAID:    Pipeline(LocalStep("mark_paid", OrderStatus.PAID, sets={"paid_cents": "amount_cents"},
                                          facts=True)),
    EventType.CONFIRM: Pipeline(LocalStep("mark_confirmed", OrderStatus.CONFIRMED),
                                effects=(EffectStep("issue_waybill", ISSUE_WAYBILL),)),
    EventType.CANCEL:  Pipeline(LocalStep("mark_cancelled", OrderStatus.CANCELLED, sets={"cancel_reason": "reason"}),
                                effects=(EffectStep("send_cancel_sms", SEND_SMS),)),
}


def effects_used(pipelines: Mapping[EventType, Pipeline] = PIPELINES) -> dict[str, Effect]:
    """Every effect some pipeline calls, by name (each needs a client at start-up)."""
    return {step.effect.name: step.effect for pipe in pipelines.values() for step in pipe.effects}
