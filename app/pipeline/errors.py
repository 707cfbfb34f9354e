"""The error tree of the pipeline.

Every error knows two things the batch processor needs: a short stable
``reason`` (it becomes the dead-letter header and the ledger's reason) and
whether retrying it can help (``retriable``). The processor asks the error;
it never keeps lists of exception types.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Root of every error the pipeline raises on purpose."""

    retriable: bool = False
    reason: str = "error"
    # True when the external call surely did not take effect (never made, or refused
    # before doing anything): even a non-idempotent effect may then be called again.
    not_delivered: bool = False
    # False when a retry may help, but not within the batch's seconds: the record is
    # dead-lettered at once as retriable, and the compensator retries it later.
    retry_in_batch: bool = True
    # True when the call failed for the provider's sake (no answer in time, no connection, 5xx,
    # "busy"): what its breaker counts (``app.pipeline.breaker``). An answer is never that.
    provider_down: bool = False
    # How soon a retry may help, when the error knows (a lease's end, the settle of an unknown
    # outcome): its dead letter is due then rather than after DLQ_RETRY_AFTER_SECONDS.
    wait_seconds: float | None = None
    # False when an error that is not retriable still leaves the step's row pending (T3 notes it
    # rather than failing it): a person decides, and may still make it done (a reconcile's adoption).
    fails_step: bool = True

    def __init__(self, message: str = "", *, reason: str | None = None, wait_seconds: float | None = None) -> None:
        super().__init__(message or self.__class__.__doc__ or self.reason)
        if reason is not None:
            self.reason = reason
        if wait_seconds is not None:
            self.wait_seconds = wait_seconds


class MalformedEvent(PipelineError):
    """The record does not follow the event contract; no retry can fix it."""

    reason = "malformed"


class UnhandledType(MalformedEvent):
    """An event of a type this processor does not act on (skipped and counted, unless strict)."""

    reason = "unknown_type"

    def __init__(self, type_name: str) -> None:
        super().__init__(f"event type {type_name[:60]!r} is not one this processor handles")
        self.type_name = type_name[:64]


class LookalikeType(MalformedEvent):
    """A type not handled that looks like a handled one (``order_paid``, ``ORDER_CONFIRMED``): never
    skipped, for a person (``app.pipeline.lookalikes``)."""

    reason = "lookalike_type"

    def __init__(self, type_name: str, handled: str, how: str) -> None:
        super().__init__(f"event type {type_name[:60]!r} is not one this processor handles, but it {how}: "
                         "dead-lettered, not skipped. Fix the producer, or read it as that type (EVENT_TYPES); "
                         "another team's type is skipped once FOREIGN_EVENT_TYPES names it")
        self.type_name = type_name[:64]
        self.handled = handled


class AmbiguousType(MalformedEvent):
    """The record names two types: the envelope's (a ``ce_type`` header) and its body's own ``type``,
    a handled one. Neither is guessed: the one would act, the other would skip."""

    reason = "ambiguous_type"


class PayloadMismatch(PipelineError):
    """The idempotency key was seen before with a different payload."""

    reason = "payload_mismatch"


class PreconditionNotMet(PipelineError):
    """The order is not in a state this event can apply to yet (e.g. PAID before CREATED)."""

    retriable = True
    reason = "precondition_not_met"


class LeaseHeld(PipelineError):
    """Another live worker holds the claim on this key; wait for its lease to end."""

    retriable = True
    reason = "lease_held"
    wait_seconds: float                 # always known: the lease's end (set by __init__)

    def __init__(self, message: str = "", *, wait_seconds: float = 0.0) -> None:
        super().__init__(message, wait_seconds=wait_seconds)


class ClaimExpiring(LeaseHeld):
    """The claim had too little lease left for the call to finish inside it; not called, claim again."""

    reason = "lease_expiring"
    not_delivered = True


class DeadlineExceeded(PipelineError):
    """The batch's deadline passed while the record was still being retried; the compensator goes on."""

    retriable = True
    reason = "deadline_exceeded"


class EffectRejected(PipelineError):
    """The external service refused the request for a business reason (4xx)."""

    reason = "effect_rejected"


class EffectUnavailable(PipelineError):
    """The external call's outcome is unknown (5xx, timeout, reset); retry with the same token."""

    retriable = True
    reason = "effect_unavailable"
    provider_down = True


class EffectNotDelivered(PipelineError):
    """The call definitely did not take effect (never made, refused, 4xx); safe to retry."""

    retriable = True
    reason = "effect_not_delivered"
    not_delivered = True


class RateLimited(EffectNotDelivered):
    """The provider said "not yet" (429): it did nothing; call again once ``wait_seconds`` have passed.
    A wait, not a failure: it uses up no retry (``app.pipeline.limits``)."""

    reason = "rate_limited"
    wait_seconds: float = 1.0


class ProviderUnavailable(EffectNotDelivered):
    """Not called: the effect's provider is down (its breaker is open). The record waits for the breaker
    in its order (``BREAKER_HOLD_RECORDS``); near its batch's deadline, or with holding off, it is
    dead-lettered as retriable, due after the breaker's next probe."""

    reason = "provider_unavailable"
    retry_in_batch = False


class EffectHeld(ProviderUnavailable):
    """Not called: a person holds the effect across the group (``app.pipeline.controls``). The record
    waits in its order until the hold ends, whatever its batch's deadline, and is never dead-lettered
    for it; the compensator leaves its letters for after the hold, no redrive counted."""

    reason = "effect_held"


class EffectBadReceipt(PipelineError):
    """The service answered success with a receipt that breaks its contract (a waybill number that
    is missing, not a string, or too long); retrying returns the same answer, so reconcile by hand."""

    reason = "effect_bad_receipt"


class UnknownOutcomeNonIdempotent(PipelineError):
    """A call without an idempotency key may or may not have taken effect; reconcile by hand."""

    reason = "unknown_outcome_non_idempotent"


class StaleEffectMayExist(PipelineError):
    """An effect is no longer wanted (its order moved past the step's target), but an earlier
    attempt may have reached its service: what it did there may have to be undone by hand."""

    reason = "stale_effect_may_exist"


class KeyHorizonPassed(PipelineError):
    """An earlier call of the step may have reached a provider that no longer keeps its key (the first
    such call is older than the provider's ``keys_kept_for``): called again, the key would be new to it
    and could make a second effect. Not called; a person decides with the facts, the step kept pending."""

    reason = "key_horizon_passed"
    fails_step = False


class EffectOutcomeUnknown(PipelineError):
    """A call without an idempotency key may or may not have taken effect, and the service can be
    asked: the retry looks it up before calling again, once a request still on its way to the
    service has surely landed (the compensator's retry, not the batch's)."""

    retriable = True
    retry_in_batch = False
    reason = "effect_outcome_unknown"


class NotAskableYet(EffectOutcomeUnknown):
    """An earlier call's outcome is unknown (or a recovery window makes the store's memory of it
    doubtful), and it is too early to ask the service: a request may still be on its way. Nothing
    was called now; a retry once ``wait_seconds`` have passed asks. Not a failure of the retry."""


class StoreUnavailable(PipelineError):
    """The database cannot be reached or keeps refusing; not the record's fault."""

    retriable = True
    reason = "store_unavailable"
    # Whether waiting for it spends the infrastructure's retry budget (INFRA_RETRY_BUDGET_SECONDS),
    # after which the worker stops (exit 70): a database that answers, slowly, is no outage.
    spends_budget = True


class DatabaseSlow(StoreUnavailable):
    """The database answers, but so late that this worker's heartbeats could not keep its claims
    safe through a call: nothing is claimed until they land sooner. Waited out without end (a
    restart would not make the database quicker); an outage spends the budget as before."""

    spends_budget = False


class StoreFailure(PipelineError):
    """The database refused a statement for a reason a retry will not fix (a bug or bad data)."""

    reason = "store_error"


class Conflict(Exception):
    """A fenced write matched fewer rows than the reads under lock promised; run the transaction again.
    Never leaves the store: it retries, then reports :class:`StoreUnavailable`."""


class AttemptsExhausted(PipelineError):
    """The step key was claimed as often as IDEM_MAX_ATTEMPTS allows without finishing: it is left to a
    person (the stuck sweep alerts on it), never claimed again automatically."""

    reason = "attempts_exhausted"


class BeyondDedupRetention(PipelineError):
    """The order is dated before the dedup store's retention: its t_idem rows may be gone, so running the
    event could repeat what was done once. It is never run again automatically."""

    reason = "beyond_dedup_retention"


class InternalError(PipelineError):
    """A bug met while handling one record; it is isolated and dead-lettered."""

    reason = "internal_error"


class Fatal(Exception):
    """The batch cannot be finished (database gone too long, dead letter not delivered):
    the worker must stop without acknowledging it, so Kafka delivers it again."""
