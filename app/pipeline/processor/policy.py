"""What a processor is built with, beside its store and effect clients: how it claims, calls and
records (:class:`ProcessorPolicy`, from the settings), and what may refuse a claim or a call
(:class:`Safeguards`, shared by the processors of a worker)."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.pipeline.limits import ProviderLimits
from app.pipeline.liveness_fence import SelfFence
from app.pipeline.retention import Retention


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessorPolicy:
    lease_seconds: float                # a claim's lease
    effect_concurrency: int             # this processor's calls in flight at once
    effect_timeout: float = 0.0         # a call's time limit; with ``lease_margin``, the lease a call needs left
    lease_margin: float = 0.0
    attempt_cap: int | None = None      # claims of a key before a person must decide (None: no cap)
    # With a ``settled`` callback, finished calls are recorded (T3) in groups of up to this many
    # outcomes, or once the oldest has waited this long: a slow call holds up only its order.
    settle_group: int = 100
    settle_after: float = 0.02

    @property
    def call_needs(self) -> float:
        """A call starts only with this much of its claim's lease left."""
        return self.effect_timeout + self.lease_margin


@dataclass(frozen=True, slots=True)
class Safeguards:
    # Each provider's pace (its rate share, its concurrency, its "not yet") and its breaker, shared by
    # every processor of this worker: a provider limits the deployment's account, not one caller.
    limits: ProviderLimits = field(default_factory=ProviderLimits)
    # This process's heartbeat (app.pipeline.liveness_fence): with it, a call starts only while
    # nobody may have taken this process for dead, and claims of owners that are dead are
    # taken over at their death. None: leases alone (the tests of the rules without it).
    fence: SelfFence | None = None
    retention: Retention | None = None  # orders dated before its cutoff are refused
