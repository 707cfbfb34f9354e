"""The chaos run's report: ``render(report)``, the summary table (markdown) printed and copied
into the README, and ``write_json(report, path)``, every figure and problem as JSON."""

from __future__ import annotations

import json
from pathlib import Path

from tests.chaos.checker import VIOLATIONS, CheckReport


def render(report: CheckReport) -> str:
    rows = [
        ("events", f"{report.events:,}: {_n(report.originals, 'original')}, "
                   f"{_n(report.exact_duplicates, 'exact duplicate')}, {report.republished:,} re-published, "
                   f"{report.malformed:,} malformed ({report.late:,} out of order); {_n(report.orders, 'order')}"),
        ("brokers", _brokers(report.cluster)),
        ("faults", f"{_n(report.kills, 'kill')}, {_n(report.rebalances, 'rebalance')}, restarts: "
                   f"{report.restarts.get('mariadb', 0)} MariaDB, {report.restarts.get('kafka', 0)} Kafka"
                   + _broker_faults(report) +
                   f"; DB cut {_s(report.cut_seconds)}, API 5xx {_s(report.api_503_seconds)}, "
                   f"API lost replies/hangs {_s(report.api_fault_seconds)}"),
        ("acknowledged records", _acked(report.acked)),
        ("events delivered again per kill (W)", _w(report)),
        ("duplicates stopped by t_idem", f"{report.duplicates_stopped:,} of the "
                                         f"{report.exact_duplicates + report.republished:,} produced made no second "
                                         "effect" + ("" if report.claims_found_done is None else
                                                     f"; {report.claims_found_done:,} claims found their key done")),
        ("accounted", f"{report.accounted.get('done', 0):,} done, {report.accounted.get('stale', 0):,} stale, "
                      f"{report.accounted.get('dead_letters', 0):,} dead-lettered"),
        ("dead letters by reason", _counts(report.dead_letters)),
        ("what became of them", f"{report.compensated:,} compensated, {report.superseded:,} superseded, "
                                f"{report.manual:,} manual{_by(report.manual_by_reason)}, "
                                f"{report.discarded:,} discarded, {report.resolved:,} resolved"
                                + (f"; {_n(report.unfinished_orders, 'order')} short of its final state until a "
                                   "person acts" if report.unfinished_orders else "")),
        ("on the dead-letter topic", _topic(report.dead_letter_topic)),
        ("effects", f"{report.effects.get('waybills', 0):,} waybills, {report.effects.get('receipts', 0):,} "
                    f"receipts, {report.effects.get('sms', 0):,} SMS"),
    ]
    rows += [(name.replace("_", " "), f"{getattr(report, name):,}") for name in VIOLATIONS]
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
    return (f"{report.w_per_kill:,.0f} ({report.replayed:,} replayed over {_n(report.kills, 'kill')}; at least "
            f"{report.w_per_kill_lower:,.0f} once every produced duplicate is taken off)")


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


def _counts(counts: dict) -> str:
    return ", ".join(f"{reason} {n:,}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) \
        or "none"


def _by(counts: dict) -> str:
    return f" ({_counts(counts)})" if counts else ""
