"""The chaos run's report: ``render(report)``, the summary table (markdown) printed and copied
into the docs (the Testing page), and ``write_json(report, path)``, every figure and problem as JSON."""

from __future__ import annotations

import json
from pathlib import Path

from harness.chaos.checker import FAILOVER_VIOLATIONS, UPGRADE_VIOLATIONS, VIOLATIONS, CheckReport


def render(report: CheckReport) -> str:
    rows = [
        ("events", f"{report.events:,}: {_n(report.originals, 'original')}, "
                   f"{_n(report.exact_duplicates, 'exact duplicate')}, {report.republished:,} re-published, "
                   f"{report.malformed:,} malformed ({report.late:,} out of order); {_n(report.orders, 'order')}"),
        ("brokers", _brokers(report.cluster)),
        ("faults", f"{_n(report.kills, 'kill')}, {_n(report.rebalances, 'rebalance')}, restarts: "
                   f"{report.restarts.get('mariadb', 0)} MariaDB, {report.restarts.get('kafka', 0)} Kafka"
                   + (f", {report.restarts['failover']} database failover" if report.restarts.get("failover") else "")
                   + _broker_faults(report) +
                   f"; DB cut {_s(report.cut_seconds)}, API 5xx {_s(report.api_503_seconds)}, "
                   f"API lost replies/hangs {_s(report.api_fault_seconds)}"),
        *([("database failover", _failover(report.failover, report.failover_ledger))] if report.failover else []),
        *_upgrade(report.upgrade),
        ("acknowledged records", _acked(report.acked)),
        ("events delivered again per kill (W)", _w(report)),
        ("duplicates stopped by t_idem", f"{report.duplicates_stopped:,} of the "
                                         f"{report.exact_duplicates + report.republished:,} produced made no second "
                                         "effect" + ("" if report.claims_found_done is None else
                                                     f"; {report.claims_found_done:,} claims found their key done")),
        ("accounted", f"{report.accounted.get('done', 0):,} done, {report.accounted.get('stale', 0):,} stale, "
                      f"{report.accounted.get('skipped', 0):,} skipped (a type not handled), "
                      f"{report.accounted.get('dead_letters', 0):,} dead-lettered"),
        ("dead letters by reason", _counts(report.dead_letters)),
        ("what became of them", f"{report.compensated:,} compensated, {report.superseded:,} superseded, "
                                f"{report.manual:,} manual{_by(report.manual_by_reason)}, "
                                f"{report.discarded:,} discarded, {report.resolved:,} resolved"
                                + (f"; {_n(report.unfinished_orders, 'order')} short of its final state until a "
                                   "person acts" if report.unfinished_orders else "")),
        ("on the dead-letter topic", _topic(report.dead_letter_topic)),
        ("effects", _effects(report.effects)),
        *([("the product's reconcile", _reconcile(report.reconcile))] if report.reconcile else []),
    ]
    rows += [(name.replace("_", " "), f"{getattr(report, name):,}") for name in VIOLATIONS
             if (report.failover or name not in FAILOVER_VIOLATIONS) and (report.upgrade or name not in UPGRADE_VIOLATIONS)]
    rows += [("wall time", _s(report.wall_seconds) + (f" (storm {_s(report.storm_seconds)}, drain "
                                                      f"{_s(report.drain.get('seconds'))})" if report.drain else "")),
             ("verdict", "ok" if report.ok else f"FAILED: {report.problems_total:,} violations")]
    lines = ["| figure | value |", "|---|---|"] + [f"| {name} | {value} |" for name, value in rows]
    if report.problems:
        lines += ["", f"First {len(report.problems)} of {report.problems_total} violations:", ""]
        lines += [f"- {line}" for line in report.problems]
    return "\n".join(lines)


def write_json(report: CheckReport, path) -> None:
    Path(path).write_text(json.dumps(report.as_dict(), indent=2, default=str) + "\n")


def _s(seconds) -> str:
    return "-" if seconds is None else f"{seconds:,.1f} s"


def _w(report: CheckReport) -> str:
    if report.w_per_kill is None:
        return "-" if report.replayed is None else f"{report.replayed:,} replayed, no kill"
    rewound = f", less the {report.rewound:,} the rewind after the failover delivered again" if report.rewound else ""
    return (f"{report.w_per_kill:,.0f} ({report.replayed:,} replayed{rewound} over {_n(report.kills, 'kill')}; "
            f"at least {report.w_per_kill_lower:,.0f} once every produced duplicate is taken off)")


def _failover(failover: dict, ledger: dict) -> str:
    how = {"semisync": "semi-synchronous (AFTER_SYNC)", "async": "asynchronous"}.get(failover.get("mode"),
                                                                                   str(failover.get("mode")))
    text = f"{how}: the primary SIGKILLed {_s(failover.get('killed_after_storm_began'))} into the storm"
    if failover.get("behind_seconds") is not None:
        text += f", its replica stopped receiving {_s(failover['behind_seconds'])} before"
    text += f"; the replica promoted in {_s(failover.get('promote_seconds'))}"
    lost = failover.get("lost")
    if lost is None:
        text += "; what it lost was not counted"
    else:
        text += (f"; the failover lost {failover['lost_t_idem']:,} t_idem rows, "
                 f"{_n(failover.get('lost_transactions') or 0, 'transaction')} ("
                 + ", ".join(f"{table} {n['missing']:,} missing + {n['behind']:,} behind" for table, n in lost.items())
                 + ")")
        if failover.get("transactions_only_on_replica"):
            newer = ", ".join(f"{table} {n:,}" for table, n in (failover.get("newer_on_replica") or {}).items() if n)
            text += (f"; the replica had {_n(failover['transactions_only_on_replica'], 'transaction')} the dead "
                     "primary's recovery rolled back (waiting for the replica's acknowledgement, so never "
                     "acknowledged to a client" + (f"; rows newer on the replica: {newer}" if newer else "") + ")")
    if ledger:
        text += ("; of the dead letters whose ledger row it lost: "
                 f"{ledger.get('copies_without_row', 0):,} copies left without a row, "
                 f"{ledger.get('filed_for_a_person', 0):,} the compensator filed for a person (no_ledger_row), "
                 f"{ledger.get('taken_over_by_the_replay', 0):,} more it filed that the replay's own dead letter "
                 "took over")
    windows = failover.get("windows_opened_by_workers") or []
    text += (f"; recovery window {windows[0]['id']} opened by {windows[0]['opened_by']}" if windows
             else "; no recovery window opened by a worker")
    rewind = failover.get("rewind")
    if rewind:
        text += (f"; the workers stopped and the group rewound ({rewind['records']:,} records read again, "
                 f"lag {_s(rewind['lag_seconds'])} + margin {_s(rewind['margin_seconds'])}"
                 + ("" if rewind.get("covered") else ", NOT far enough") + ")")
    return text


def _upgrade(upgrade: dict) -> list[tuple[str, str]]:
    """A row for the migration and one per replacement: its replay window and how long the group took."""
    if not upgrade:
        return []
    migration = upgrade.get("migration") or {}
    previous = (upgrade.get("previous") or {}).get("version")
    rows = [("rolling upgrade", f"release {previous} and the current code in one group; the schema "
                                f"{migration.get('from')} -> {migration.get('to')} online in "
                                f"{_s(migration.get('seconds'))} while {len(migration.get('workers') or {})} workers of "
                                f"{previous} wrote ({migration.get('committed_meanwhile')} records committed meanwhile)"
                                + (f", FAILED: {migration['error'][:200]}" if migration.get("error") else "")
                                + f"; {previous} ran {_s(upgrade.get('previous_on_new_schema_seconds'))} on the new "
                                  f"schema (worker-seconds); at the end the schema is at {upgrade['schema'].get('at_end')}")]
    for r in upgrade.get("replacements", []):
        what = f"{r.get('kind', '?').replace('_', ' ')} of {r.get('slot')}"
        if r.get("error"):
            rows.append((what, f"FAILED: {r['error'][:200]}"))
            continue
        rows.append((what, f"{r['stopped']} ({r['stopped_version']}) -> {r['started']} ({r['started_version']}): "
                           f"exit {r['returncode']} {_s(r['stop_seconds'])} after the SIGTERM, the group Stable at "
                           f"{_s(r['stable_seconds'])}, every partition consumed again at {_s(r['rebalance_seconds'])}; "
                           f"replay window {r['replayed']} (the replay counter +{r['replayed_counter']:g} meanwhile, "
                           f"{r['duplicates_in_span']} produced duplicates in that span)"))
    return rows


def _brokers(cluster: dict) -> str:
    nodes = cluster.get("nodes", 1)
    how = cluster.get("security_protocol", "PLAINTEXT")
    if cluster.get("sasl_mechanism") and "SASL" in how:
        how += f" ({cluster['sasl_mechanism']})"
    return f"{_n(nodes, 'node')}, {how}" + (", the workers through a proxy per node" if cluster.get("proxied") else "")


def _broker_faults(report: CheckReport) -> str:
    leader, controller = report.restarts.get("leader", 0), report.restarts.get("controller", 0)
    if not (leader or controller or report.broker_cut_seconds):
        return ""
    return (f", the busiest partition's leader {leader}x, the active controller {controller}x; "
            f"brokers cut {_s(report.broker_cut_seconds)}")


def _reconcile(ran: dict) -> str:
    if ran.get("records") is None:
        return f"did not complete (exit {ran.get('exit')})"
    return (f"{ran['records']:,} records in {_s(ran.get('seconds'))}, {ran.get('findings') or 0:,} findings; "
            f"{ran.get('agree', 0):,} of {ran.get('compared', 0):,} records judged as the checker judged them")


def _acked(acked: dict) -> str:
    if not acked:
        return "-"
    during = ", ".join(f"{n:,} {kind.replace('_', ' ')}" for kind, n in sorted(acked.get("in_flight_during", {}).items()))
    return (f"{acked.get('records', 0):,}: {acked.get('on_log', 0):,} on the log at their offsets "
            f"({acked.get('same_bytes', 0):,} of {acked.get('checked_bytes', 0):,} compared byte for byte), "
            f"{acked.get('consumed', 0):,} read past and accounted for"
            + (f"; in flight during a fault: {during}" if during else ""))


def _n(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _topic(dlq: dict) -> str:
    behind = dlq.get("committed_behind")
    return (f"{dlq.get('records', 0):,} dead letters ({dlq.get('extra_copies', 0):,} sent again by a replay, "
            f"{dlq.get('rows_without_copy', 0):,} ledger rows without one); the compensator "
            + ("has not consumed it" if behind is None else "consumed them all" if behind == 0 else
               f"is {behind:,} behind"))


def _effects(effects: dict) -> str:
    """What the services did, each effect the checker counted (not the raw calls):
    "526 waybills, 526 receipts, 358 SMS"."""
    done = {name: n for name, n in effects.items()
            if not name.endswith("_calls") and name != "peak_in_flight_per_key"}
    shown = {"waybills": 0, "receipts": 0, "sms": 0, **done}         # the first three even at 0
    return ", ".join(f"{n:,} {LABELS.get(name, name)}" for name, n in shown.items())


LABELS = {"sms": "SMS", "sms_unknown_manual": "SMS of unknown outcome left to a person"}


def _counts(counts: dict) -> str:
    return ", ".join(f"{reason} {n:,}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) \
        or "none"


def _by(counts: dict) -> str:
    return f" ({_counts(counts)})" if counts else ""
