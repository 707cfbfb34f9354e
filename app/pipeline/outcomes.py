"""How an event ended. The values are the ``outcome`` label of ``order_events_total``
and, for local steps, what ``t_idem.outcome`` records."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    APPLIED = "applied"          # its steps ran now
    STALE = "stale"              # its order was already at or past where it would move it: nothing to do
    DUPLICATE = "duplicate"      # it ran before (a replay, or the same request twice)
    SUPERSEDED = "superseded"    # another worker took its claim over and finishes it
    DEAD_LETTER = "dead_letter"  # it went to the dead-letter topic and the compensation ledger
    SKIPPED = "skipped"          # a type this processor does not handle (UNHANDLED_EVENT_TYPES=skip)
