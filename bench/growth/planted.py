"""The rows planted at size: the dead-letter ledger and ``t_idem``'s stuck rows."""

from __future__ import annotations

from datetime import date

from bench.growth.prefill import DAYS, OWNER

STUCK_ROWS = 100
STUCK_OVER_CAP = 5
ATTEMPT_CAP = 20
RECENT_OPEN = 300                         # the newest ledger rows are open, inside the SLA
PLANTED_LETTERS = {1: 10, 2: 5, 4: 5}     # status -> rows past the SLA (open, retrying, manual)


def ledger_statement(total: int, group: str) -> str:
    """``total`` dead letters over the past year, oldest first: 1 in 1000 discarded, resolved or
    superseded, the newest ``RECENT_OPEN`` open (inside the SLA), the rest compensated."""
    order_no = "CONCAT('ORD-', DATE_FORMAT(f, '%Y%m%d'), '-C', LPAD(seq, 9, '0'))"
    reasons = ("effect_unavailable", "effect_unavailable", "effect_unavailable", "effect_unavailable",
               "precondition_not_met", "precondition_not_met", "deadline_exceeded", "effect_rejected",
               "lease_held", "store_unavailable")
    reason = "ELT(seq MOD 10 + 1, " + ", ".join(f"'{r}'" for r in reasons) + ")"
    return (
        "INSERT INTO t_compensation (src_topic, src_partition, src_offset, src_timestamp, consumer_group, order_no, "
        "event_id, biz_key, status, reason, message, retriable, attempts, next_retry_at, may_be_superseded, truncated, "
        "worker_id, first_failure_at, record_key, record_value, record_headers, redrives, gmt_create, gmt_modified) "
        f"SELECT 'order-event', seq MOD 8, seq DIV 8, UNIX_TIMESTAMP(f) * 1000, '{group}', {order_no}, "
        "LOWER(CONCAT_WS('-', LEFT(h, 8), MID(h, 9, 4), MID(h, 13, 4), MID(h, 17, 4), RIGHT(h, 12))), "
        f"CONCAT({order_no}, ':ORDER_CONFIRM:issue_waybill'), st, {reason}, "
        f"CONCAT('POST /v1/waybills for ', {order_no}, ' answered 503 after 3 tries: upstream unavailable'), "
        f"{reason} <> 'effect_rejected', 1 + seq MOD 5, IF(st = 1, f + INTERVAL 60 SECOND, NULL), seq MOD 7 = 0, 0, "
        f"'worker-1', f, {order_no}, "
        f"CONCAT('{{\"event_id\":\"', h, '\",\"order_no\":\"', {order_no}, '\",\"type\":\"ORDER_CONFIRM\",'"
        ", '\"occurred_at\":\"', DATE_FORMAT(f, '%Y-%m-%dT%H:%i:%s.000+08:00'), '\",\"data\":{}}'), "
        "'[]', IF(st = 3, 1 + seq MOD 3, 0), f, IF(st = 1, f, f + INTERVAL 90 SECOND) "
        "FROM (SELECT seq, MD5(CONCAT('event-', seq)) AS h, "
        f"IF(seq > {total - RECENT_OPEN}, UTC_TIMESTAMP(3) - INTERVAL ({total} - seq + 1) SECOND, "
        f"UTC_TIMESTAMP(3) - INTERVAL (({total} - seq) * {DAYS * 86400} DIV {total}) SECOND) AS f, "
        f"CASE WHEN seq > {total - RECENT_OPEN} THEN 1 WHEN seq MOD 1000 = 3 THEN 5 WHEN seq MOD 1000 = 4 THEN 7 "
        f"WHEN seq MOD 1000 = 5 THEN 6 ELSE 3 END AS st FROM seq_1_to_{total}) AS s")


def planted_letters_statement(group: str) -> str:
    """A few rows for the sweep to report: open, retrying and manual, two hours past their first failure."""
    rows = []
    n = 0
    for status, count in PLANTED_LETTERS.items():
        for _ in range(count):
            n += 1
            lease = "UTC_TIMESTAMP(3) + INTERVAL 30 SECOND" if status == 2 else "NULL"
            owner = "'worker-2/compensator/0b1c2d3e'" if status == 2 else "NULL"
            rows.append(
                f"('order-event', {n % 8}, {10_000_000 + n}, -1, '{group}', 'ORD-20261130-LATE{n:04d}', "
                f"'late-{n}', 'ORD-20261130-LATE{n:04d}:ORDER_CONFIRM:issue_waybill', {status}, 'effect_unavailable', "
                f"'POST /v1/waybills answered 503', 1, {5 if status == 4 else 2}, NULL, 0, 0, 'worker-1', "
                f"UTC_TIMESTAMP(3) - INTERVAL 2 HOUR, {owner}, {lease})")
    return ("INSERT INTO t_compensation (src_topic, src_partition, src_offset, src_timestamp, consumer_group, order_no, "
            "event_id, biz_key, status, reason, message, retriable, attempts, next_retry_at, may_be_superseded, "
            "truncated, worker_id, first_failure_at, owner, lease_until) VALUES " + ", ".join(rows))


def stuck_statement(today: date) -> str:
    """``STUCK_ROWS`` pending effect rows of today's orders, untouched for 11 minutes to an hour;
    ``STUCK_OVER_CAP`` of them claimed ``ATTEMPT_CAP`` times or more."""
    day = today.strftime("%Y%m%d")
    return (
        "INSERT INTO t_idem (biz_key, part_date, step, status, attempt, owner, lease_until, idem_token, payload_hash, "
        "outcome, last_err, gmt_create, gmt_modified) "
        f"SELECT CONCAT('ORD-{day}-STUCK', LPAD(seq, 5, '0'), IF(seq MOD 3 = 0, ':ORDER_CANCEL:send_cancel_sms', "
        f"':ORDER_CONFIRM:issue_waybill')), DATE'{today.isoformat()}', "
        "IF(seq MOD 3 = 0, 'send_cancel_sms', 'issue_waybill'), 1, "
        f"IF(seq <= {STUCK_OVER_CAP}, {ATTEMPT_CAP} + seq, 1 + seq MOD 3), '{OWNER}', m + INTERVAL 30 SECOND, "
        "MD5(CONCAT('stuck-', seq)), SHA2(CONCAT('stuck-', seq), 256), IF(seq MOD 2 = 0, 'effect_unavailable', NULL), "
        "IF(seq MOD 2 = 0, 'POST /v1/waybills answered 503: upstream unavailable', NULL), m, m "
        f"FROM (SELECT seq, UTC_TIMESTAMP(3) - INTERVAL (660 + seq * 29) SECOND AS m FROM seq_1_to_{STUCK_ROWS}) AS s")
