"""What each event type does, declared as data.

A *local* step moves the order in ``t_order``; it runs inside T1, in the same
transaction as its claim. An *effect* step calls an external service outside
any transaction, with an idempotency token persisted in T1. Each step has its
own idempotency key, so a replay resumes at the first step not yet done.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Mapping

from app.pipeline.events import EventType, OrderEvent
from app.pipeline.states import OrderStatus

DEFAULT_KEY_FORMAT = "{order_no}:{type}:{step}"


class Effect(str, Enum):
    WAYBILL = "waybill"    # logistics API; honours Idempotency-Key
    SMS = "sms"            # SMS gateway; no idempotency key: never retried on an unknown outcome

    @property
    def idempotent(self) -> bool:
        """Whether the service deduplicates by our token, so a call may be repeated."""
        return self is Effect.WAYBILL


@dataclass(frozen=True, slots=True)
class LocalStep:
    name: str
    moves_order_to: OrderStatus


@dataclass(frozen=True, slots=True)
class EffectStep:
    name: str
    effect: Effect


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
    EventType.CREATED: Pipeline(LocalStep("create_order", OrderStatus.CREATED)),
    EventType.PAID:    Pipeline(LocalStep("mark_paid", OrderStatus.PAID)),
    EventType.CONFIRM: Pipeline(LocalStep("mark_confirmed", OrderStatus.CONFIRMED),
                                effects=(EffectStep("issue_waybill", Effect.WAYBILL),)),
    EventType.CANCEL:  Pipeline(LocalStep("mark_cancelled", OrderStatus.CANCELLED),
                                effects=(EffectStep("send_cancel_sms", Effect.SMS),)),
}
