"""What the checker holds a rolling upgrade to (the manifest's ``upgrade``, written by
``harness.chaos.upgrade``); like the rest of the checker, it imports nothing from ``app/``.

Every replacement is judged from the sources, with the moments the driver alone could see:

    replayed          the replay window of the replacement: records the stopped worker had
                      finished and not committed, which its partitions' next owner reads again.
                      A record counts when its offset is at or past the group's committed offset
                      read right after the worker exited, and either the stopped worker's stream
                      (``t_idem.owner`` ``<its id>/main/...``) claimed its event's step (the key's
                      first record on the log is past that offset: a duplicate of a key it did
                      before it is no replay), or the worker dead-lettered it (``t_compensation``
                      ``worker_id``). After a SIGTERM it must be 0 (``upgrade_replayed``).
    replayed_counter  how much every worker's ``order_events_replayed_total`` rose from the SIGTERM
                      until the group consumed again: the replay anywhere in the group, the
                      duplicates the workload placed there included (``duplicates_in_span``:
                      those between the offsets committed at the SIGTERM and then)
    seconds           from the SIGTERM: the exit, the group Stable with every member again, every
                      partition consumed again (``rebalance``)

``upgrade_incomplete`` fails a run whose upgrade did not happen as planned: the migration failed
or was not run, the schema is not at the current code's head at the end (read here), a replacement
failed, or stopped the wrong version, or its worker did not exit 0 after the SIGTERM, fewer
replacements than planned, or no worker of the previous release ran on the new schema.
``upgrade_unfinished`` fails one that left an order short of its final state until a person acts
(elsewhere a figure): only malformed records may wait for a person after an upgrade, and a release
that cannot work on the other's schema leaves its events there (dead letters ``internal_error``).
"""

from __future__ import annotations

from contextlib import closing

import pymysql

from harness.chaos import evidence, rules
from harness.chaos.accounting import Findings

VIOLATIONS = ("upgrade_replayed", "upgrade_incomplete", "upgrade_unfinished")
DUPLICATES = ("exact_duplicate", "republished")


def check_upgrade(manifest: dict, tables, findings: Findings, *, unfinished_orders: int = 0) -> dict:
    """The upgrade's figures for the report; its violations into ``findings``. ``unfinished_orders``: the
    orders the accounting found short of their final state until a person acts."""
    upgrade = manifest.get("upgrade")
    if not upgrade:
        return {}
    if unfinished_orders:
        findings.flag("upgrade_unfinished", f"{unfinished_orders} orders short of their final state until a person "
                                            "acts", unfinished_orders)
    first = first_records(manifest["produced"])
    figures = {"previous": upgrade.get("previous"), "schema": dict(upgrade.get("schema") or {}),
               "migration": _migration(upgrade, findings), "replacements": []}
    figures["schema"]["at_end"] = _schema_at_end(manifest, upgrade, findings)
    for entry in upgrade.get("replacements", []):
        figures["replacements"].append(_replacement(entry, manifest, tables, first, findings))
    planned = upgrade.get("planned") or {}
    done = [r["kind"] for r in upgrade.get("replacements", []) if not r.get("error")]
    for kind, step in (("upgrade", "upgrade_worker"), ("roll_back", "roll_back_worker")):
        if done.count(kind) < planned.get(step, 0):
            findings.flag("upgrade_incomplete", f"{done.count(kind)} of the {planned[step]} planned {kind} "
                                                "replacements happened")
    figures["previous_on_new_schema_seconds"] = _previous_on_new_schema(manifest, upgrade)
    if planned.get("migrate_online") and not figures["previous_on_new_schema_seconds"]:
        findings.flag("upgrade_incomplete", f"no worker of release {upgrade['previous']['version']} ran on the "
                                            "new schema")
    return figures


def _migration(upgrade: dict, findings: Findings) -> dict | None:
    migration = upgrade.get("migration")
    if (upgrade.get("planned") or {}).get("migrate_online") and migration is None:
        findings.flag("upgrade_incomplete", "the migration was planned and did not run")
    if migration is None:
        return None
    if migration.get("error"):
        findings.flag("upgrade_incomplete", f"the online migration failed: {migration['error'][:300]}")
    return {k: migration.get(k) for k in ("from", "to", "seconds", "committed_meanwhile", "workers", "error")}


def _schema_at_end(manifest: dict, upgrade: dict, findings: Findings) -> str | None:
    head = (upgrade.get("schema") or {}).get("current_head")
    try:
        with closing(evidence.connect(manifest["mysql"])) as conn, conn.cursor() as cur:
            cur.execute("SELECT version_num FROM alembic_version")
            row = cur.fetchone()
    except pymysql.MySQLError as exc:
        findings.flag("unreadable", f"alembic_version: {exc!r}")
        return None
    found = row["version_num"] if row else None
    if (upgrade.get("planned") or {}).get("migrate_online") and found != head:
        findings.flag("upgrade_incomplete", f"the schema is at {found} at the end, not at the current code's head {head}")
    return found


def _replacement(entry: dict, manifest: dict, tables, first: dict, findings: Findings) -> dict:
    kind = entry.get("kind")
    name = f"{kind} of {entry.get('slot')} ({entry.get('stopped')} {entry.get('stopped_version')} -> " \
           f"{entry.get('started')} {entry.get('started_version')})"
    figure = {k: entry.get(k) for k in ("kind", "slot", "stopped", "stopped_version", "started", "started_version",
                                        "returncode", "replayed_counter", "error")}
    if entry.get("error"):
        findings.flag("upgrade_incomplete", f"{name} failed: {entry['error'][:300]}")
        return figure
    if entry.get("stopped_version") != entry.get("from_version") or entry.get("started_version") != entry.get("to_version"):
        findings.flag("upgrade_incomplete", f"{name}: meant to replace {entry.get('from_version')} with "
                                            f"{entry.get('to_version')}")
    if entry.get("returncode") != 0:
        findings.flag("upgrade_incomplete", f"{name}: the worker exited {entry.get('returncode')} after its SIGTERM")
    if entry.get("input_flowing") is False:
        findings.flag("upgrade_incomplete", f"{name}: the input had ended before the group consumed again (the run "
                                            "produces too few records for its steps)")
    at = entry["sigterm_at"]
    figure.update(stop_seconds=_since(at, entry.get("exited_at")), stable_seconds=_since(at, entry.get("stable_at")),
                  rebalance_seconds=_since(at, entry.get("consuming_at")))
    replayed = (replay_window(entry["stopped"], entry["committed_at_exit"], first, tables.idem, tables.ledger,
                              manifest["events_topic"]) if tables is not None else None)
    figure["replayed"] = None if replayed is None else len(replayed)
    if replayed:
        findings.flag("upgrade_replayed", f"{name}: {len(replayed)} records it finished past the offsets committed "
                                          f"at its exit, e.g. {replayed[:5]}", len(replayed))
    figure["duplicates_in_span"] = duplicates_in_span(manifest["produced"], entry)
    return figure


def replay_window(worker: str, committed_at_exit: dict, first: dict[str, tuple[int, int]], idem: dict[str, dict],
                  ledger: list[dict], topic: str) -> list[str]:
    """The records at or past the offsets committed when ``worker`` exited that it had finished: a
    step its stream claimed (``first``: each key's first record, ``first_records``) or a record it
    dead-lettered. Its compensator's claims (``<id>/compensator/...``) are no reads of the topic."""
    committed = _offsets(committed_at_exit)
    found = []
    for key, (partition, offset) in first.items():
        row = idem.get(key)
        if row and str(row.get("owner") or "").startswith(f"{worker}/main/") and offset >= committed[partition]:
            found.append(f"{key} at {partition}:{offset}")
    for row in ledger:
        if (row.get("worker_id") == worker and row["src_topic"] == topic
                and row["src_offset"] >= committed.get(row["src_partition"], 0)):
            found.append(f"dead letter {row['reason']} at {row['src_partition']}:{row['src_offset']}")
    return found


def first_records(produced: list[dict]) -> dict[str, tuple[int, int]]:
    """The local step's key of each valid event -> the first record on the log that carries it (an order's
    records share its partition)."""
    first: dict[str, tuple[int, int]] = {}
    for e in produced:
        if e["kind"] == "malformed" or not e.get("order_no") or e.get("type") not in rules.LOCAL_STEP:
            continue
        key = rules.step_keys(e["order_no"], e["type"])[0]      # the local step's: one per event
        if key not in first or e["offset"] < first[key][1]:
            first[key] = (e["partition"], e["offset"])
    return first


def duplicates_in_span(produced: list[dict], entry: dict) -> int | None:
    """The workload's duplicates between the offsets committed at the SIGTERM and when the group consumed
    again: what the replay counter counts in that span besides replays."""
    low, high = entry.get("committed_at_sigterm"), entry.get("committed_when_consuming")
    if low is None or high is None:
        return None
    low, high = _offsets(low), _offsets(high)
    return sum(1 for e in produced if e["kind"] in DUPLICATES and low[e["partition"]] <= e["offset"] < high[e["partition"]])


def _previous_on_new_schema(manifest: dict, upgrade: dict) -> float:
    """Seconds of the previous release's workers' lives after the migration ended, summed."""
    migrated = (upgrade.get("migration") or {}).get("ended_at")
    version = (upgrade.get("previous") or {}).get("version")
    if migrated is None:
        return 0.0
    end = manifest.get("drained_at") or manifest.get("storm_ended_at") or migrated
    lives = [(max(w["started_at"], migrated), w.get("ended_at") or end) for w in manifest.get("workers", [])
             if w.get("version") == version]
    return round(sum(max(0.0, b - a) for a, b in lives), 1)


def _offsets(by_partition: dict) -> dict[int, int]:
    return {int(p): int(o) for p, o in by_partition.items()}


def _since(at: float, then: float | None) -> float | None:
    return None if then is None else round(then - at, 1)
