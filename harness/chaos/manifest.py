"""What the driver hands the checker (harness/chaos/CONTRACT.md): every record it produced and
where it landed, every order's lifecycle, every worker process and how it ended, every
fault and when, what the workers counted, and how the drain ended. Beside the contract's
keys: the profile, the workers' settings and the run's timings, for the report."""

from __future__ import annotations

from collections import Counter


def metrics(totals: dict) -> dict:
    """The last /metrics reading of every worker process, summed, under the contract's names."""
    def by_label(name: str) -> dict:
        return {key: int(value) for key, value in totals.get(name, {}).items()}

    claims = by_label("order_idem_claims_total")
    return {
        "replayed": int(totals.get("order_events_replayed_total", 0)),
        "claims": claims,
        "claims_done": claims.get("done", 0),
        "dead_letters": by_label("order_dead_letters_total"),
        "events": by_label("order_events_total"),
        "malformed": by_label("order_events_malformed_total"),
        "compensations": by_label("order_compensations_total"),
        "effect_calls": by_label("order_effect_calls_total"),
        "retries": by_label("order_record_retries_total"),
        "rebalances_seen": int(totals.get("order_kafka_rebalances_total", 0)),
        "infra_wait_seconds": round(totals.get("order_infra_wait_seconds_total", 0.0), 1),
        "lease_waits": int(totals.get("order_lease_waits_total", 0)),
        "batches": int(totals.get("order_batches_total", 0)),
    }


def drain(backlog, seconds: float | None) -> dict:
    return {"seconds": seconds, "settled": backlog.settled, "open_left": backlog.open_left,
            "pending_left": backlog.pending, "ledger": backlog.ledger, "abandoned": backlog.abandoned,
            "behind": {topic: {str(p): list(v) for p, v in behind.items()} for topic, behind in backlog.behind.items()}}


def figures(manifest: dict) -> dict:
    """What the driver alone can say, for a report without a checker."""
    return {"records": dict(Counter(entry["kind"] for entry in manifest["produced"])),
            "orders": len(manifest["orders"]),
            "faults": dict(Counter(fault["kind"] for fault in manifest["faults"])),
            "metrics": manifest["metrics"], "drain": manifest["drain"],
            "unexpected_exits": [w for w in manifest["workers"]
                                 if w["returncode"] is not None and not (w["killed_by_test"] or w["stopped_by_test"])]}
