"""What the chaos run's database failover counts as lost (harness/chaos/failover.py), and the
dead letters whose ledger row it lost, which the checker lets go (harness/chaos/accounting.py)."""

from __future__ import annotations

from harness.chaos.accounting import lost_ledger_rows
from harness.chaos.failover import compare

KEY = ("ORD-20261201-X1:ORDER_CONFIRM:issue_waybill", "2026-12-01")
OTHER = ("ORD-20261201-X2:ORDER_CREATED:create_order", "2026-12-01")
DONE, PENDING = (2, 1, "waybill_issued", "t1"), (1, 1, None, "t1")


def tables(idem: dict, ledger: dict | None = None) -> dict:
    return {"t_idem": idem, "t_order": {}, "t_waybill_receipt": {}, "t_compensation": ledger or {}}


def test_rows_of_transactions_the_replica_never_got_are_lost():
    # Asynchronous: the old primary committed 0-1-12, the replica had applied 0-1-10.
    found = compare(tables({KEY: DONE, OTHER: DONE}), tables({KEY: PENDING}), "0-1-12", "0-1-10")
    assert found["lost_transactions"] == 2 and found["transactions_only_on_replica"] == 0
    assert found["lost"]["t_idem"] == {"missing": 1, "behind": 1, "sample": [list(OTHER), list(KEY)]}
    assert found["lost_total"] == 2 and found["newer_on_replica"]["t_idem"] == 0


def test_a_transaction_the_old_primary_rolled_back_is_newer_on_the_replica_not_lost():
    # AFTER_SYNC: the replica acknowledged 0-1-485; the primary died before its engine committed
    # it, and its recovery rolled it back. The row differs, the replica is the one ahead.
    found = compare(tables({KEY: PENDING}), tables({KEY: DONE}), "0-1-484", "0-1-485")
    assert found["lost_transactions"] == 0 and found["transactions_only_on_replica"] == 1
    assert found["lost"]["t_idem"]["behind"] == 0 and found["lost_total"] == 0
    assert found["newer_on_replica"]["t_idem"] == 1


def test_a_row_only_the_old_primary_has_is_lost_whatever_the_positions_say():
    found = compare(tables({OTHER: DONE}), tables({}), "0-1-5", "0-1-5")
    assert found["lost"]["t_idem"]["missing"] == 1 and found["lost_total"] == 1


def test_the_ledger_rows_it_lost_are_listed_for_the_checker():
    lost = ("order-event-processor", "order-event", 3, 186, 1764611000000)
    kept = ("order-event-processor", "order-event", 3, 185, 1764610999000)
    found = compare(tables({}, {lost: (1, 0, 0), kept: (3, 1, 1)}), tables({}, {kept: (1, 0, 0)}), "0-1-9", "0-1-8")
    assert found["lost"]["t_compensation"]["keys"] == [list(lost)]
    manifest = {"group": "order-event-processor", "events_topic": "order-event",
                "failover": {"lost": {"t_compensation": {"keys": [*found["lost"]["t_compensation"]["keys"],
                                                                  ["another-group", "order-event", 0, 1, 5],
                                                                  ["order-event-processor", "order-event-dlq", 0, 1, 5]]}}}}
    assert lost_ledger_rows(manifest) == {(3, 186)}
    assert lost_ledger_rows({"group": "g", "events_topic": "t"}) == set()
