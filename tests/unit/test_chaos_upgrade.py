"""The replay window the chaos checker gives each replacement of a rolling upgrade
(harness/chaos/upgrade_check.py): the records the stopped worker finished and did not commit."""

from __future__ import annotations

from harness.chaos.upgrade_check import duplicates_in_span, first_records, replay_window

TOPIC = "order-event"


def event(partition: int, offset: int, order: str, type_: str = "ORDER_CREATED", kind: str = "original") -> dict:
    return {"partition": partition, "offset": offset, "kind": kind, "order_no": f"ORD-20261207-{order}",
            "type": type_}


def key(order: str, type_: str = "ORDER_CREATED", step: str = "create_order") -> str:
    return f"ORD-20261207-{order}:{type_}:{step}"


PRODUCED = [event(0, 10, "A"), event(0, 11, "B"), event(0, 12, "A", kind="exact_duplicate"),
            event(1, 5, "C"), event(1, 6, "C", "ORDER_PAID")]
FIRST = first_records(PRODUCED)


def test_a_step_its_stream_claimed_past_its_last_commit_is_replayed():
    idem = {key("B"): {"owner": "w1.1/main/abc"}, key("C"): {"owner": "w1.1/main/abc"}}
    found = replay_window("w1.1", {"0": 11, "1": 6}, FIRST, idem, [], TOPIC)
    assert found == [f"{key('B')} at 0:11"]


def test_a_duplicate_past_the_commit_of_a_record_it_did_before_is_no_replay():
    idem = {key("A"): {"owner": "w1.1/main/abc"}}
    assert replay_window("w1.1", {"0": 11, "1": 0}, FIRST, idem, [], TOPIC) == []
    assert FIRST[key("A")] == (0, 10)


def test_what_another_worker_or_its_compensator_did_is_not_its_replay():
    idem = {key("B"): {"owner": "w2.1/main/abc"}, key("C", "ORDER_PAID", "mark_paid"): {"owner": "w1.1/compensator/x"},
            key("C"): {"owner": "w1.10/main/abc"}}
    assert replay_window("w1.1", {"0": 0, "1": 0}, FIRST, idem, [], TOPIC) == []


def test_a_record_it_dead_lettered_past_its_last_commit_is_replayed():
    ledger = [{"worker_id": "w1.1", "src_topic": TOPIC, "src_partition": 1, "src_offset": 6, "reason": "not_json"},
              {"worker_id": "w1.1", "src_topic": TOPIC, "src_partition": 1, "src_offset": 5, "reason": "not_json"},
              {"worker_id": "w2.1", "src_topic": TOPIC, "src_partition": 1, "src_offset": 7, "reason": "not_json"},
              {"worker_id": "w1.1", "src_topic": "order-event-dlq", "src_partition": 1, "src_offset": 9, "reason": "x"}]
    assert replay_window("w1.1", {"0": 0, "1": 6}, FIRST, {}, ledger, TOPIC) == ["dead letter not_json at 1:6"]


def test_the_duplicates_in_a_replacements_span_are_counted_from_the_offsets_committed_at_its_ends():
    entry = {"committed_at_sigterm": {"0": 11, "1": 0}, "committed_when_consuming": {"0": 13, "1": 6}}
    assert duplicates_in_span(PRODUCED, entry) == 1
    assert duplicates_in_span(PRODUCED, {"committed_at_sigterm": {"0": 13, "1": 0}, "committed_when_consuming":
                                         {"0": 13, "1": 6}}) == 0
