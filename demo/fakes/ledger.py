"""What the fake providers did, as they saw it: ``GET /__ledger`` answers :meth:`Ledger.as_json`,
``POST /__reset`` starts a new one. The tests, the chaos checker and the benchmarks read it.

Shared by every fake: ``calls`` (every raw call, each with its ``service``: the call, or its lookup),
``effects`` (what each fake did, by effect and order: ``{"waybill": {order: [{"reference", "key",
"at", "provider"}]}}``: the chaos checker's account of an effect it has no check of its own for),
``keys`` (when each key was first taken, per fake: ``{"waybill": {key: at}}``), ``injected`` (the
faults each fake injected, by kind), ``rate_limited`` and ``outage_calls`` (the 429s, and the
calls an outage met, per fake), and the highest number of calls that were in flight at once for one
idempotency key (or, for SMS, one order).

The shipped providers' own records, in the shape the tests read: ``waybills`` (per order, every
waybill issued by the logistics API or the express courier), ``issued``, ``cancels``,
``cancel_calls`` and ``listings`` (the logistics API's), ``sms`` (per order, each message with
``at``, when it was accepted: epoch seconds), ``refused_signatures`` (the express courier's).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


def _per_order() -> defaultdict[str, defaultdict[str, list[dict]]]:
    return defaultdict(lambda: defaultdict(list))


@dataclass
class Ledger:
    calls: list[dict] = field(default_factory=list)
    effects: dict[str, dict[str, list[dict]]] = field(default_factory=_per_order)
    # What a repeated key answers, per fake: the reference its first call got.
    answers: dict[str, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))
    # When each key was last taken as new (what a provider that forgets keys counts from), and first taken.
    taken_at: dict[tuple[str, str], float] = field(default_factory=dict)
    keys: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    injected: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    in_flight: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    peak_in_flight: int = 0
    rate_limited: dict[str, int] = field(default_factory=lambda: defaultdict(int))    # 429s, by fake
    outage_calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))    # calls met by an outage
    # The shipped providers' own records (see the module's docstring).
    waybills: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    issued: dict[str, dict] = field(default_factory=dict)     # the logistics API's, by number, in the order issued
    cancels: list[dict] = field(default_factory=list)         # each waybill cancelled, once
    cancel_calls: list[dict] = field(default_factory=list)    # each cancel asked
    listings: list[dict] = field(default_factory=list)        # each listing asked
    sms: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))
    nonces: set[str] = field(default_factory=set)
    refused_signatures: int = 0

    def as_json(self) -> dict:
        return {"calls": self.calls, "effects": self.effects, "waybills": self.waybills,
                "issued": list(self.issued.values()), "cancels": self.cancels, "cancel_calls": self.cancel_calls,
                "listings": self.listings, "sms": self.sms, "peak_in_flight_per_key": self.peak_in_flight,
                "refused_signatures": self.refused_signatures, "rate_limited": self.rate_limited,
                "outage_calls": self.outage_calls, "injected": self.injected, "keys": self.keys,
                "counts": {"calls": len(self.calls),
                           "waybills": sum(len(v) for v in self.waybills.values()),
                           "sms": sum(len(v) for v in self.sms.values())}}
