"""How long each cancelled order of a chaos run waited for its SMS, and what the slowest waited on.

For every order whose CANCEL was produced, from the gateway's ledger (when it accepted the order's
first SMS, ``at``) and the run's database:

* **consumed -> accepted**: from the first transaction that took the CANCEL (the ``gmt_create``
  of its local step's ``t_idem`` row: the database's clock, the same machine's), or its first
  failure if it was dead-lettered before (its order not created yet), to the gateway's acceptance
  of its SMS;
* **produced -> accepted**: from the broker's acknowledgement of the CANCEL's first copy, which
  counts the time the record waited to be consumed too (a broker down, a rebalance).

The tail (past ``SLOW_SECONDS``) comes with its story: the SMS step's row, the order's dead letters
and their history, the gateway's calls for it, and the faults of the storm in between. Reads only;
like the checker, it imports nothing from ``app/``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from harness.chaos import evidence

SLOW_SECONDS = 60.0
LIMIT_SECONDS = 180.0
STORIES = 25


def percentile(values: list[float], p: float) -> float | None:
    """The nearest-rank percentile (p in 0-100)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(round(p / 100 * len(ordered), 9)) - 1)]


def distribution(values: list[float]) -> dict:
    return {"count": len(values), **{f"p{p:g}": _r(percentile(values, p)) for p in (50, 90, 99, 99.9)},
            "max": _r(max(values, default=None)), f"over_{SLOW_SECONDS:g}s": sum(v > SLOW_SECONDS for v in values),
            f"over_{LIMIT_SECONDS:g}s": sum(v > LIMIT_SECONDS for v in values),
            f"within_{SLOW_SECONDS:g}s_percent": _r(100 * sum(v <= SLOW_SECONDS for v in values) / len(values))
            if values else None}


def sms_latency(mysql: dict, ledger: dict, produced: list[dict], faults: list[dict]) -> dict:
    cancels = {}
    for entry in produced:
        if entry.get("type") == "ORDER_CANCEL" and entry.get("kind") in ("original", "republished", "duplicate"):
            acked = entry.get("acked_at")
            order = entry["order_no"]
            if acked is not None and (order not in cancels or acked < cancels[order]):
                cancels[order] = acked
    with evidence.connect(mysql) as conn, conn.cursor() as cur:
        cur.execute("SELECT biz_key, gmt_create FROM t_idem WHERE step = 'mark_cancelled'")
        consumed = {row["biz_key"].split(":")[0]: _epoch(row["gmt_create"]) for row in cur.fetchall()}
        # A CANCEL that failed before its first transaction went through (its order not created
        # yet, a lease held) was consumed when it first failed.
        cur.execute("SELECT order_no, MIN(first_failure_at) AS first FROM t_compensation "
                    "WHERE biz_key LIKE '%%:ORDER_CANCEL:mark_cancelled' GROUP BY order_no")
        for row in cur.fetchall():
            if row["order_no"] in consumed:
                consumed[row["order_no"]] = min(consumed[row["order_no"]], _epoch(row["first"]))
        accepted = {order: min(sms["at"] for sms in sent) for order, sent in ledger.get("sms", {}).items() if sent}
        since_consumed, since_produced, missing, slow = [], [], [], []
        for order, acked in sorted(cancels.items()):
            if order not in accepted:
                if order in consumed:          # consumed, and cancelled: its SMS never went out
                    missing.append(order)
                continue
            if order in consumed:
                waited = accepted[order] - consumed[order]
                since_consumed.append(waited)
                if waited > SLOW_SECONDS:
                    slow.append((waited, order))
            since_produced.append(accepted[order] - acked)
        stories = [_story(cur, order, waited, consumed[order], accepted[order], ledger, faults)
                   for waited, order in sorted(slow, reverse=True)[:STORIES]]
    return {"consumed_to_accepted": distribution(since_consumed),
            "produced_to_accepted": distribution(since_produced),
            "cancelled_without_sms": missing, "slowest": stories}


def _story(cur, order: str, waited: float, consumed: float, accepted: float, ledger: dict,
           faults: list[dict]) -> dict:
    cur.execute("SELECT attempt, owner, outcome, last_err, gmt_create, gmt_modified FROM t_idem WHERE biz_key = %s",
                (f"{order}:ORDER_CANCEL:send_cancel_sms",))
    step = cur.fetchone()
    cur.execute("SELECT id, reason, status, redrives, first_failure_at, worker_id FROM t_compensation "
                "WHERE order_no = %s ORDER BY id", (order,))
    letters = cur.fetchall()
    for letter in letters:
        cur.execute("SELECT at, actor, action, to_status, LEFT(detail, 160) AS detail FROM t_compensation_audit "
                    "WHERE compensation_id = %s ORDER BY id", (letter["id"],))
        letter["history"] = [{**h, "at": round(_epoch(h["at"]) - consumed, 1)} for h in cur.fetchall()]
        letter["first_failure_at"] = round(_epoch(letter["first_failure_at"]) - consumed, 1)
    token = None
    calls = []
    for call in ledger.get("calls", []):
        body = call.get("body") or {}
        if call["service"] == "sms" and order in str(body.get("text")):
            token = body.get("client_ref")
            calls.append({"at": round(call["at"] - consumed, 1), "call": "send"})
    calls += [{"at": round(call["at"] - consumed, 1), "call": "lookup"} for call in ledger.get("calls", [])
              if call["service"] == "sms_lookup" and token is not None and call.get("client_ref") == token]
    return {"order_no": order, "waited": round(waited, 1), "accepted_at": round(accepted - consumed, 1),
            "step": None if step is None else {
                "attempt": step["attempt"], "owner": step["owner"], "outcome": step["outcome"],
                "last_err": (step["last_err"] or "")[:200],
                "claimed_at": round(_epoch(step["gmt_create"]) - consumed, 1)},
            "dead_letters": letters, "gateway": sorted(calls, key=lambda c: c["at"]),
            "faults": [{"at": round(f["at"] - consumed, 1), "kind": f["kind"], "worker": f.get("worker")}
                       for f in faults if consumed - 90 <= f["at"] <= accepted]}


def _epoch(moment: datetime) -> float:
    return moment.replace(tzinfo=UTC).timestamp()


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def render(latency: dict) -> str:
    lines = []
    for name, title in (("consumed_to_accepted", "consumed -> SMS accepted"),
                        ("produced_to_accepted", "produced -> SMS accepted")):
        d = latency[name]
        lines.append(f"{title}: {d['count']:,} SMS, p50 {d['p50']} s, p90 {d['p90']} s, p99 {d['p99']} s, "
                     f"p99.9 {d['p99.9']} s, max {d['max']} s; {d[f'within_{SLOW_SECONDS:g}s_percent']} % within "
                     f"{SLOW_SECONDS:g} s, {d[f'over_{LIMIT_SECONDS:g}s']} past {LIMIT_SECONDS:g} s")
    lines.append(f"cancelled orders without an SMS: {len(latency['cancelled_without_sms'])}")
    return "\n".join(lines)
