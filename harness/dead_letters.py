"""Dead letters written fast, as the pipeline leaves them after an outage of a service: the
order moved (confirmed or cancelled), its local step done, its effect step pending with its
derived token and a claim that ran out, and its ledger row waiting for a person (``manual``,
given up after its redrives) or open."""

from __future__ import annotations

from app.pipeline.events import decode
from app.pipeline.plan import step_keys
from app.pipeline.tokens import StepTokens
from harness.events import event, order_no, record
from harness.services import TEST_TOKEN_SECRET, ScratchDatabase

MANUAL, OPEN = 4, 1
KINDS = {
    # type: (order status, local step, effect step, ledger reason, message)
    "ORDER_CONFIRM": (3, "mark_confirmed", "issue_waybill", "effect_unavailable", "logistics answered 503"),
    "ORDER_CANCEL": (4, "mark_cancelled", "send_cancel_sms", "effect_not_delivered", "the gateway refused the "
                                                                                     "connection"),
}


def write_dead_letters(db: ScratchDatabase, group: str, topic: str, rows: int, *, type_: str = "ORDER_CONFIRM",
                       status: int = MANUAL, prefix: str = "BULK", first_offset: int = 0) -> list[str]:
    """``rows`` dead letters of ``type_`` for ``group``; their order numbers."""
    tokens = StepTokens(TEST_TOKEN_SECRET.encode())
    order_status, local_step, effect_step, reason, message = KINDS[type_]
    orders = [order_no(prefix=prefix) for _ in range(rows)]
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            for start in range(0, rows, 1000):
                chunk = orders[start:start + 1000]
                docs = [event(o, type_) for o in chunk]
                events = [decode(*record(d), max_bytes=1 << 20) for d in docs]
                cur.executemany(
                    "INSERT INTO t_order (order_no, status, amount_cents, phone, address, paid_cents, cancel_reason, "
                    "has_dead_letters, gmt_create, gmt_modified) VALUES (%s, %s, 12900, '+8613800000000', "
                    "'1 Test Road', 12900, NULL, 1, NOW(3), NOW(3))", [(o, order_status) for o in chunk])
                idem = []
                for e in events:
                    local, effect = step_keys(e)
                    idem.append((local, e.part_date, local_step, 2, None, None, e.payload_hash, "applied"))
                    idem.append((effect, e.part_date, effect_step, 1, "gone/main/x", tokens(effect), e.payload_hash,
                                 reason))
                cur.executemany(
                    "INSERT INTO t_idem (biz_key, part_date, step, status, attempt, owner, lease_until, idem_token, "
                    "payload_hash, outcome, gmt_create, gmt_modified) VALUES (%s, %s, %s, %s, 4, %s, "
                    "NOW(3) - INTERVAL 1 MINUTE, %s, %s, %s, NOW(3), NOW(3))", idem)
                retriable, redrives = (0, 5) if status == MANUAL else (1, 0)
                cur.executemany(
                    "INSERT INTO t_compensation (src_topic, src_partition, src_offset, src_timestamp, consumer_group, "
                    "order_no, event_id, biz_key, status, reason, message, retriable, attempts, redrives, "
                    "next_retry_at, first_failure_at, record_key, record_value, record_headers, gmt_create, "
                    "gmt_modified) VALUES (%s, 0, %s, 1, %s, %s, %s, %s, %s, %s, %s, %s, 4, %s, "
                    + ("NULL" if status == MANUAL else "NOW(3) + INTERVAL 1 DAY")
                    + ", NOW(3) - INTERVAL 10 MINUTE, %s, %s, '[]', NOW(3), NOW(3))",
                    [(topic, first_offset + start + i, group, e.order_no, e.event_id, step_keys(e)[0], status, reason,
                      message, retriable, redrives, *record(d)) for i, (d, e) in enumerate(zip(docs, events))])
        conn.commit()
    finally:
        conn.close()
    return orders
