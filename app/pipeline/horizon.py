"""A provider's key horizon: how long it keeps an idempotency key, and what a step past it is.

A ``replays`` or ``refuses_duplicates`` provider answers a repeated key as the first call's only
while it keeps the key (``keys_kept_for``, declared by each provider, ``app/adapters/effects/``).
Once the first call of a step that may have reached it is older than that, the same key is new to
it again: a second waybill, not a replay. T1 asks :func:`past_horizon` of each pending effect row (one
comparison, from what it read), and a step past it is a call in doubt (``app.pipeline.plan``): asked
with the provider's lookup, or left to a person with :func:`facts` and :func:`what_to_check`.
"""

from __future__ import annotations

from app.pipeline.model import NOT_DELIVERED, IdemRow


def past_horizon(row: IdemRow, horizon: float | None) -> bool:
    """An earlier claim may have reached the provider (the row is not "surely not delivered"), and the
    first such claim is older than the provider keeps keys (``horizon`` seconds; None: for ever)."""
    return horizon is not None and row.first_call_age > horizon and row.outcome != NOT_DELIVERED


def facts(effect: str, row: IdemRow, horizon: float) -> str:
    """Why a step's key may be new to its provider again, as a person reads it."""
    return (f"its first call that may have reached the {effect} provider was {span(row.first_call_age)} ago, and "
            f"the provider keeps idempotency keys for {span(horizon)} (EFFECTS__{effect.upper()}__KEYS_KEPT_FOR_SECONDS)"
            f": the same token again ({row.idem_token}) could make a second {effect}")


def what_to_check(order_no: str, row: IdemRow) -> str:
    """What a person does with a step whose provider may have forgotten its key and cannot be asked."""
    hours = int(row.first_call_age // 3600) + 2
    return (f"Look for what the provider did for order {order_no} under idempotency key {row.idem_token} since "
            f"then (a provider that lists what it did: `faust -A app reconcile --last {hours}h` files it as an "
            "orphan case; adopt it, then retry this dead letter: the step is done). If it did nothing, resolve or "
            "discard this dead letter and have the effect made by hand.")


def span(seconds: float) -> str:
    """A duration as a person reads it: 4.5s, 45s, 12m, 26h, 3d 4h."""
    whole = int(seconds)
    if whole < 120:
        return f"{seconds:.2g}s" if seconds < 10 else f"{whole}s"
    if whole < 7200:
        return f"{whole // 60}m"
    if whole < 172800:
        return f"{whole // 3600}h"
    return f"{whole // 86400}d {whole % 86400 // 3600}h"
