"""A reconcile run's report: the range, each partition's offsets, how many records ended each way,
the findings with their evidence, and the providers' side; as JSON (stored with the run, served on
the console) and as text (the command's default)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from app.reconcile.input import FINDINGS, End, Tally

SKIPPED_TYPES_SHOWN = 100
# The order a person reads the ends in: the findings last, where the eye lands.
ENDS = (End.DONE, End.DUPLICATE, End.SUPERSEDED, End.SKIPPED, End.DEAD_LETTER, End.IN_PROGRESS, End.UNREAD)


@dataclass
class Report:
    group: str
    topic: str
    since: datetime
    until: datetime
    started_by: str
    run_id: int | None = None
    partitions: list[dict[str, Any]] = field(default_factory=list)   # partition, start, end, committed
    tally: Tally = field(default_factory=Tally)
    providers: dict[str, Any] | None = None
    provider_findings: int = 0
    seconds: float = 0.0
    waited: dict[str, float] = field(default_factory=dict)     # seconds waited on Kafka and on the database
    error: str | None = None
    foreign: frozenset[str] = frozenset()                      # FOREIGN_EVENT_TYPES: the types skipped knowingly

    @property
    def findings(self) -> int:
        return self.tally.findings_total + self.provider_findings

    @property
    def status(self) -> str:
        if self.error is not None:
            return "failed"
        return "findings" if self.findings else "clean"

    def summary(self) -> dict[str, int]:
        """The findings by kind, the providers' as ``provider``: what the gauges show."""
        return {**self.tally.by_kind(), "provider": self.provider_findings}

    def skipped_types(self) -> list[dict[str, Any]]:
        """The records skipped by type, the most first (at most ``SKIPPED_TYPES_SHOWN``; the rest under a
        ``type`` of None), each with whether ``FOREIGN_EVENT_TYPES`` names it."""
        counts = sorted(self.tally.skipped_types.items(), key=lambda kv: (kv[0] is None, -kv[1], kv[0] or ""))
        shown = [(name, n) for name, n in counts if name is not None][:SKIPPED_TYPES_SHOWN]
        rest = sum(n for _, n in counts) - sum(n for _, n in shown)
        listed = [{"type": name, "records": n, "declared": name in self.foreign} for name, n in shown]
        return listed + ([{"type": None, "records": rest, "declared": False}] if rest else [])

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "status": self.status, "group": self.group, "topic": self.topic,
            "from": self.since.isoformat(), "to": self.until.isoformat(), "started_by": self.started_by,
            "records": self.tally.records, "ends": dict(self.tally.ends), "skipped_types": self.skipped_types(),
            "findings_total": self.findings,
            "findings_by_kind": self.tally.by_kind(), "findings": self.tally.findings,
            "findings_shown": len(self.tally.findings), "partitions": self.partitions,
            "providers": self.providers, "seconds": round(self.seconds, 3),
            "waited_seconds": {k: round(v, 3) for k, v in self.waited.items()},
            "records_per_second": round(self.tally.records / self.seconds, 1) if self.seconds else None,
            "error": self.error,
        }

    def text(self) -> str:
        d = self.as_dict()
        span = f"{self.since.isoformat(timespec='seconds')} .. {self.until.isoformat(timespec='seconds')}"
        lines = [f"reconcile of {self.topic} for {self.group}, {span}"
                 + (f" (run {self.run_id})" if self.run_id else ""),
                 f"{d['records']:,} records in {d['seconds']:.1f} s over {len(self.partitions)} partitions: "
                 + ", ".join(f"{self.tally.ends[e.value]:,} {e.value}" for e in ENDS if self.tally.ends[e.value])]
        if d["skipped_types"]:
            lines.append("skipped by type: " + ", ".join(
                f"{t['records']:,} " + (repr(t["type"]) + ("" if t["declared"] else " (not in FOREIGN_EVENT_TYPES)")
                                        if t["type"] is not None else "of other types")
                for t in d["skipped_types"]))
        if self.error:
            lines.append(f"FAILED: {self.error}")
        if self.providers:
            for effect, side in (self.providers.get("effects") or {}).items():
                if side.get("not_listable"):
                    lines.append(f"provider {side.get('provider')} ({effect}): cannot list what it did; not compared")
                elif side.get("error"):
                    lines.append(f"provider {side.get('provider')} ({effect}): NOT COMPARED: {side['error']}")
                else:
                    lines.append(f"provider {side.get('provider')} ({effect}): {side.get('listed', 0):,} listed, "
                                 f"{side.get('receipts', 0):,} receipts; {side.get('duplicates', 0)} duplicates, "
                                 f"{side.get('orphans', 0)} orphans, {side.get('missing', 0)} missing")
        if not self.findings:
            lines.append("every record reached an end: nothing found" if not self.error else "")
            return "\n".join(line for line in lines if line)
        kinds = ", ".join(f"{n:,} {kind}" for kind, n in self.summary().items() if n)
        lines.append(f"FINDINGS: {self.findings:,}" + (f" ({kinds})" if kinds else ""))
        for f in self.tally.findings:
            lines.append(f"  {f['kind']}: {f['topic']}[{f['partition']}]@{f['offset']} {f.get('order_no') or '-'} "
                         f"{f.get('type') or ''}: {f['why']}")
        if self.tally.findings_total > len(self.tally.findings):
            lines.append(f"  ... and {self.tally.findings_total - len(self.tally.findings):,} more")
        for f in (self.providers or {}).get("findings", []):
            held = {"duplicate": f"keeps {f.get('keeper')}, extras {', '.join(f.get('extras') or [])}",
                    "orphan": f"{f.get('keeper')} at the provider, no receipt here",
                    "missing": f"the receipt's {f.get('keeper')} is not at the provider"}.get(f.get("kind"), "")
            lines.append(f"  provider {f.get('kind')}: {f.get('effect')} of {f.get('order_no')} ({f.get('provider')}): "
                         f"{held}")
        return "\n".join(lines)


__all__ = ["FINDINGS", "Report"]
