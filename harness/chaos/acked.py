"""Every record the producer had acknowledged was consumed.

An acknowledgement (``acks=all``) is the brokers' promise that the record is in the log at its
(partition, offset) and stays there when a leader dies. For each record the producer had
acknowledged, the checker asks the log and the group:

    its own offset     no other acknowledged record was given the same (partition, offset)
    on the log         the topic, read from the beginning, holds a record at that offset ...
    the same bytes     ... with the digest of the key and value the producer sent (another
                       record there: the log was cut back and written again)
    consumed           the group's committed offset on its partition is past it
    accounted          it ended done, stale or dead-lettered (``accounting``), not lost

Any of these missing is an ``acked_not_consumed`` violation naming the record.

A record whose send was in flight while a broker fault was on (a leader or the active
controller SIGKILLed and not yet started again, the single broker down, the brokers cut) is
counted by that fault: the report shows how many acknowledgements the faults met, and the
test asserts that the leader kills met some.
"""

from __future__ import annotations

from collections import Counter

from harness.chaos.accounting import Findings
from harness.chaos.evidence import TopicRead, record_digest

# A broker fault's window: from the first kind to the second (or the end of the storm).
BROKER_WINDOWS = {"leader_kill": "leader_start", "controller_kill": "controller_start", "kafka_kill": "kafka_start",
                  "broker_cut": "broker_restore"}


def windows(manifest: dict) -> list[tuple[str, float, float]]:
    """(kind, from, to) of every broker fault of the run."""
    until = manifest.get("storm_ended_at") or manifest.get("drained_at") or float("inf")
    found, open_ = [], {}
    for fault in sorted(manifest.get("faults", []), key=lambda f: f["at"]):
        kind, key = fault["kind"], (fault["kind"], fault.get("node"))
        if kind in BROKER_WINDOWS:
            open_[key] = fault["at"]
            continue
        for on, off in BROKER_WINDOWS.items():
            if kind == off and (on, fault.get("node")) in open_:
                found.append((on, open_.pop((on, fault.get("node"))), fault["at"]))
    found += [(kind, since, until) for (kind, _), since in open_.items()]
    return sorted(found, key=lambda w: w[1])


def check_acked(manifest: dict, events: TopicRead, category, findings: Findings) -> dict:
    """The figures of the check; each violation goes to ``findings``. ``category(entry)`` is the
    accounting's verdict on a record ("lost" or how it ended), None when the tables were unreadable."""
    produced = manifest["produced"]
    faults = windows(manifest)
    figures = {"records": len(produced), "on_log": 0, "same_bytes": 0, "consumed": 0,
               "in_flight_during": Counter(), "checked_bytes": 0}
    on_log = {(r.partition, r.offset): r for r in events.records}
    at = Counter((e["partition"], e["offset"]) for e in produced)
    for entry in produced:
        coords = (entry["partition"], entry["offset"])
        name = f"{entry['kind']} {entry.get('type') or entry.get('malformed_kind')} of {entry.get('order_no')} " \
               f"acknowledged at [{coords[0]}]@{coords[1]}{_when(entry)}"
        sent, acked = entry.get("sent_at"), entry.get("acked_at")
        if sent is not None and acked is not None:
            for kind, since, until in faults:
                if sent <= until and acked >= since:
                    figures["in_flight_during"][kind] += 1
        if at[coords] > 1:
            findings.flag("acked_not_consumed", f"{name}: {at[coords]} acknowledged records were given this offset")
        if events.error:
            continue
        record = on_log.get(coords)
        if record is None:
            findings.flag("acked_not_consumed", f"{name}: no record at this offset on {manifest['events_topic']}")
            continue
        figures["on_log"] += 1
        if entry.get("digest") is not None:
            figures["checked_bytes"] += 1
            if record_digest(record.key, record.value) != entry["digest"]:
                findings.flag("acked_not_consumed", f"{name}: the log holds other bytes at this offset")
                continue
            figures["same_bytes"] += 1
        committed = events.committed.get(coords[0])
        if committed is None or committed <= coords[1]:
            findings.flag("acked_not_consumed", f"{name}: the group committed {committed} on partition "
                                                f"{coords[0]}, not past it")
            continue
        if category is not None and category(entry) == "lost":
            findings.flag("acked_not_consumed", f"{name}: read past, but neither done, stale nor dead-lettered")
            continue
        figures["consumed"] += 1
    figures["in_flight_during"] = dict(figures["in_flight_during"])
    return figures


def _when(entry: dict) -> str:
    if entry.get("acked_at") is None:
        return ""
    return f" (sent {entry.get('sent_at', 0):.3f}, acknowledged {entry['acked_at']:.3f})"
