"""How one record of the input ended, judged from what the tables hold about it.

A record is named by its coordinates (topic, partition, offset). Its end is one of:

============  =====================================================================================
end           what shows it
============  =====================================================================================
dead_letter   a ledger row (``t_compensation``) at its coordinates: written before its batch could
              commit, whatever became of it (compensated, superseded, for a person)
done          its local step ``done applied`` in ``t_idem``, each effect step ``done`` (and, for an
              effect with a receipt table, its receipt there with the step's token)
duplicate     the same, for a record whose request (order and type) an earlier record of the range
              already accounts for: an exact duplicate, a re-publication, a relay's copy
superseded    its local step ``done stale``, or an effect step ``failed stale``: the order had moved
              past it, so nothing was owed
skipped       a type this processor does not handle (``UNHANDLED_EVENT_TYPES=skip``); the report lists
              them by type and count (a type that looks like a handled one is never skipped: its
              record is a dead letter, ``lookalike_type``)
unread        past the group's committed offset: not read yet (not a finding; the next run sees it)
in_progress   a step ``pending`` for less than the stuck threshold (not a finding)
============  =====================================================================================

Anything else is a **finding**:

====================  ============================================================================
finding               what it means
====================  ============================================================================
unaccounted           read past (committed) and neither dead-lettered nor finished: lost. A step row
                      missing, a step failed with no dead letter to say so, a malformed record with
                      no ledger row
stuck                 a step ``pending`` for longer than the stuck threshold
receipt_mismatch      an effect step ``done`` whose receipt is missing, or holds another token: the
                      receipt was deleted or written by something else
ledger_without_record a ledger row of this group naming an offset of the range where the topic holds
                      no record (found by :func:`ledger_strays`)
====================  ============================================================================

The keys of ``t_idem`` carry no event id (``<order_no>:<type>:<step>``), so every copy of a request
lands on the same rows; that is what makes a duplicate accounted for by its original.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.reconcile.ports import ReceiptRow, StepRow

PENDING, DONE, FAILED = 1, 2, 3
STALE = "stale"
APPLIED = "applied"


class End(StrEnum):
    DEAD_LETTER = "dead_letter"
    DONE = "done"
    DUPLICATE = "duplicate"
    SUPERSEDED = "superseded"
    SKIPPED = "skipped"
    UNREAD = "unread"
    IN_PROGRESS = "in_progress"
    # findings
    UNACCOUNTED = "unaccounted"
    STUCK = "stuck"
    RECEIPT_MISMATCH = "receipt_mismatch"
    LEDGER_WITHOUT_RECORD = "ledger_without_record"

    @property
    def finding(self) -> bool:
        return self in FINDINGS


FINDINGS = frozenset({End.UNACCOUNTED, End.STUCK, End.RECEIPT_MISMATCH, End.LEDGER_WITHOUT_RECORD})


@dataclass(frozen=True, slots=True)
class Read:
    """What decoding a record found: a request (order, type, its steps' keys, which of them has a
    receipt table), or a type skipped, or the reason it is malformed."""

    order_no: str | None = None
    type: str | None = None
    local_key: str | None = None
    effect_keys: tuple[str, ...] = ()
    receipt_keys: frozenset[str] = frozenset()        # effect keys whose effect writes a receipt row
    skipped_type: str | None = None
    malformed: str | None = None

    @property
    def request(self) -> tuple[str, str] | None:
        return (self.order_no, self.type) if self.order_no and self.type else None


@dataclass(frozen=True, slots=True)
class Verdict:
    end: End
    why: str = ""
    steps: tuple[dict[str, Any], ...] = ()       # the rows that decided it, for the evidence


def judge(read: Read, *, ledger: Sequence[Mapping[str, Any]], committed: int | None, offset: int,
          steps: Mapping[str, StepRow], receipts: Mapping[str, ReceiptRow], stuck_after: float,
          seen: set[tuple[str, str]]) -> Verdict:
    """How the record at ``offset`` ended. ``ledger``: the ledger rows at its coordinates;
    ``committed``: the group's committed offset on its partition (None: nothing committed);
    ``steps``/``receipts``: by key, what the tables hold; ``seen``: the requests earlier records of
    the range ended (this one's is added when it ends done or superseded)."""
    if ledger:
        letter = ledger[0]
        return Verdict(End.DEAD_LETTER, f"ledger row {letter.get('id')}: {letter.get('reason')}, {letter.get('status')}")
    if committed is None or offset >= committed:
        return Verdict(End.UNREAD, f"past the committed offset {committed}")
    if read.skipped_type is not None:
        return Verdict(End.SKIPPED, read.skipped_type)
    if read.request is None:
        return Verdict(End.UNACCOUNTED, f"malformed ({read.malformed}) and read past without a ledger row")
    keys = (read.local_key, *read.effect_keys)
    evidence = tuple(_evidence(key, steps.get(key)) for key in keys if key)
    local = steps.get(read.local_key or "")
    verdict = _steps(read, local, steps, receipts, stuck_after)
    if verdict is not None:
        return Verdict(verdict[0], verdict[1], evidence)
    superseded = local is not None and local.outcome == STALE or any(
        (row := steps.get(key)) is not None and row.status == FAILED and row.outcome == STALE for key in read.effect_keys)
    end = End.SUPERSEDED if superseded else End.DONE
    if end is End.DONE and read.request in seen:
        end = End.DUPLICATE
    seen.add(read.request)
    return Verdict(end, "", evidence)


def _steps(read: Read, local: StepRow | None, steps: Mapping[str, StepRow], receipts: Mapping[str, ReceiptRow],
           stuck_after: float) -> tuple[End, str] | None:
    """A finding or a step still in progress, or None when every step reached its end."""
    if local is None:
        return End.UNACCOUNTED, f"no t_idem row {read.local_key}"
    if local.status == PENDING:
        return _pending(local, stuck_after)
    if local.status != DONE:
        return End.UNACCOUNTED, f"{local.biz_key} failed ({local.outcome}) and no dead letter says so"
    if local.outcome == STALE:
        return None
    for key in read.effect_keys:
        row = steps.get(key)
        if row is None:
            return End.UNACCOUNTED, f"no t_idem row {key}"
        if row.status == PENDING:
            return _pending(row, stuck_after)
        if row.status == FAILED:
            if row.outcome == STALE:
                continue
            return End.UNACCOUNTED, f"{key} failed ({row.outcome}) and no dead letter says so"
        if key in read.receipt_keys:
            receipt = receipts.get(key)
            if receipt is None:
                return End.RECEIPT_MISMATCH, f"{key} is done but has no receipt"
            if receipt.token != row.token:
                return End.RECEIPT_MISMATCH, f"{key} is done with token {row.token}, its receipt holds {receipt.token}"
    return None


def _pending(row: StepRow, stuck_after: float) -> tuple[End, str]:
    if row.age_seconds > stuck_after:
        return End.STUCK, f"{row.biz_key} pending for {row.age_seconds:.0f} s (attempt {row.attempt})"
    return End.IN_PROGRESS, f"{row.biz_key} pending for {row.age_seconds:.0f} s"


def _evidence(key: str, row: StepRow | None) -> dict[str, Any]:
    if row is None:
        return {"key": key, "row": None}
    return {"key": key, "status": {PENDING: "pending", DONE: "done", FAILED: "failed"}.get(row.status, row.status),
            "outcome": row.outcome, "attempt": row.attempt}


def ledger_strays(rows: Iterable[Mapping[str, Any]], offsets: set[int]) -> list[Mapping[str, Any]]:
    """The ledger rows among ``rows`` (one partition's, inside the range's offsets) whose offset holds
    no record the range read."""
    return [row for row in rows if row["src_offset"] not in offsets]


@dataclass
class Tally:
    """Counts per end, the records skipped by type (the first ``MAX_SKIPPED_TYPES`` names, the rest
    together under ``None``: a range of random types is not a report of random types), and the findings
    (the first ``keep``)."""

    MAX_SKIPPED_TYPES = 1000

    keep: int = 1000
    ends: dict[str, int] = field(default_factory=lambda: {end.value: 0 for end in End})
    skipped_types: dict[str | None, int] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    findings_total: int = 0

    def add(self, verdict: Verdict, *, topic: str, partition: int, offset: int, order_no: str | None,
            type_: str | None) -> None:
        self.ends[verdict.end.value] += 1
        if verdict.end is End.SKIPPED:
            name = type_ if type_ in self.skipped_types or len(self.skipped_types) < self.MAX_SKIPPED_TYPES else None
            self.skipped_types[name] = self.skipped_types.get(name, 0) + 1
        if verdict.end.finding:
            self.finding(verdict.end, verdict.why, topic=topic, partition=partition, offset=offset,
                         order_no=order_no, type_=type_, steps=list(verdict.steps))

    def finding(self, end: End, why: str, *, topic: str, partition: int, offset: int, order_no: str | None,
                type_: str | None = None, steps: list | None = None, **more: Any) -> None:
        if end is End.LEDGER_WITHOUT_RECORD:
            self.ends[end.value] += 1
        self.findings_total += 1
        if len(self.findings) < self.keep:
            self.findings.append({"kind": end.value, "why": why, "topic": topic, "partition": partition,
                                  "offset": offset, "order_no": order_no, "type": type_, "steps": steps or [],
                                  **more})

    @property
    def records(self) -> int:
        return sum(n for end, n in self.ends.items() if end != End.LEDGER_WITHOUT_RECORD.value)

    def by_kind(self) -> dict[str, int]:
        return {end.value: self.ends[end.value] for end in End if end.finding}
