"""The chaos checker's own copy of the rules (harness/chaos/rules.py), against the pipeline's:
the two are written apart on purpose, so this is where they must agree."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from itertools import product

import pytest

from app.pipeline.events import EventType
from app.pipeline.states import LedgerStatus, OrderStatus
from app.pipeline.states import judge_move as pipeline_judge
from app.pipeline.steps import PIPELINES, Effect, EffectStep
from harness.chaos import checker, rules
from harness.chaos.accounting import Accountant, Findings
from harness.chaos.driver import declared_effect_steps
from harness.chaos.evidence import Tables, TopicRead
from harness.chaos.orders import OrderCheck

ORDER_STATES = [None, *OrderStatus]


@pytest.mark.parametrize("current, target", list(product(ORDER_STATES, OrderStatus)))
def test_the_checker_judges_every_move_as_the_pipeline_does(current, target):
    assert rules.judge(None if current is None else int(current), int(target)) == pipeline_judge(current, target).value


def test_the_checker_knows_every_step_key_of_every_event_type():
    for type_ in EventType:
        pipe = PIPELINES[type_]
        local, effect = rules.step_keys("ORD-20261130-X1", type_.value)
        assert local == f"ORD-20261130-X1:{type_.value}:{pipe.local.name}"
        assert effect == (f"ORD-20261130-X1:{type_.value}:{pipe.effects[0].name}" if pipe.effects else None)
        assert rules.TARGET[type_.value] == int(pipe.local.moves_order_to)


@pytest.mark.parametrize("types, final", [
    (["ORDER_CREATED"], rules.CREATED),
    (["ORDER_PAID", "ORDER_CREATED"], rules.PAID),
    (["ORDER_CONFIRM", "ORDER_PAID", "ORDER_CREATED"], rules.CONFIRMED),
    (["ORDER_CREATED", "ORDER_CANCEL", "ORDER_PAID"], rules.CANCELLED),
    (["ORDER_CREATED", "ORDER_CONFIRM"], rules.CREATED),          # a CONFIRM without PAID is never ready
    (["ORDER_PAID", "ORDER_CANCEL"], None),                         # no CREATED: no order
])
def test_the_final_state_follows_from_the_set_of_events(types, final):
    assert rules.final_state(types) == final


def test_a_replay_in_time_order_explains_stale_and_applied():
    ok, end, _ = rules.replay([(1, "ORDER_CREATED", "applied", [0]), (2, "ORDER_CANCEL", "applied", [1]),
                               (3, "ORDER_PAID", "stale", [2])])
    assert (ok, end) == (True, rules.CANCELLED)
    ok, _, why = rules.replay([(1, "ORDER_CREATED", "applied", [0]), (2, "ORDER_CANCEL", "applied", [1]),
                               (3, "ORDER_PAID", "applied", [2])])
    assert not ok and "ORDER_PAID" in why


def test_rows_of_one_transaction_are_ordered_by_their_records_offsets():
    # One T1 wrote all three: its events were judged in offset order, CANCEL (offset 1) before PAID (2),
    # so an applied PAID cannot be explained, though CREATED, PAID, CANCEL would be a legal order.
    moves = [(5, "ORDER_CREATED", "applied", [0]), (5, "ORDER_CANCEL", "applied", [1]),
             (5, "ORDER_PAID", "applied", [2])]
    assert not rules.replay(moves)[0]
    # The PAID also has a record before the CANCEL's (the original at 1; the copy at 3 came later):
    # that one may have written the row, PAID then CANCEL.
    moves = [(4, "ORDER_CREATED", "applied", [0]), (5, "ORDER_CANCEL", "applied", [2]),
             (5, "ORDER_PAID", "applied", [3, 1])]
    assert rules.replay(moves)[:2] == (True, rules.CANCELLED)


@pytest.mark.parametrize("kind, reason, fits", [
    ("not_json", "not_json", True), ("bad_amount", "bad_field:data.amount_cents", True),
    ("null_key_value", "empty_value", True), ("not_object", "not_object", True), ("not_object", "not_json", False),
    ("bad_type", "precondition_not_met", False), ("something_new", "bad_field:data.phone", True),
    ("something_new", "effect_unavailable", False),
])
def test_a_malformed_record_needs_a_reason_that_fits_its_kind(kind, reason, fits):
    assert rules.reason_fits(kind, reason) is fits


def test_the_test_brokers_get_cluster_ids_the_storage_tool_accepts():
    # One base64url id in 64 starts with a dash, which kafka-storage reads as an option.
    from harness.kafka_cluster import new_cluster_id

    ids = [new_cluster_id() for _ in range(5000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == len(ids)


def test_the_checker_checks_every_effect_the_pipeline_declares():
    assert rules.unchecked_effects(declared_effect_steps()) == []


def _with_fax(pipelines):
    fax = Effect("fax", done="fax_sent", request=lambda event, order: {})
    cancel = pipelines[EventType.CANCEL]
    return {**pipelines, EventType.CANCEL: replace(cancel, effects=(*cancel.effects, EffectStep("send_fax", fax)))}


def test_an_effect_the_checker_has_no_check_for_fails_the_run():
    """A third effect declared (a fax) and not taught to the checker: the run is
    not ok, with a line that names it, though nothing else went wrong."""
    findings = Findings()
    checker._effects_checked({"effect_steps": declared_effect_steps(_with_fax(PIPELINES))},
                             {"calls": [{"service": "fax"}] * 3 + [{"service": "waybill"}]}, findings)
    assert findings.counts["unchecked_effects"] == 4          # the declaration, and its three calls
    assert any("'fax'" in line and "send_fax" in line for line in findings.problems)
    assert any("3 calls to the service 'fax'" in line for line in findings.problems)


def test_a_manifest_without_the_declared_effects_fails_the_run():
    findings = Findings()
    checker._effects_checked({}, {"calls": []}, findings)
    assert findings.counts["unchecked_effects"] == 1


def test_a_known_effect_moved_to_another_step_is_not_taken_as_checked():
    moved = [{"event_type": "ORDER_PAID", "step": "issue_waybill", "effect": "waybill"}]
    assert rules.unchecked_effects(moved) and "ORDER_CONFIRM" in rules.unchecked_effects(moved)[0]


def test_the_checker_names_every_ledger_status_as_the_pipeline_does():
    assert rules.LEDGER_STATUS == {int(s): s.name.lower() for s in LedgerStatus}


def test_the_sms_latency_percentiles_are_nearest_rank_and_count_the_tail():
    from harness.chaos.latency import distribution

    waits = [1.0] * 998 + [61.0, 200.0]
    d = distribution(waits)
    assert (d["p50"], d["p99"], d["p99.9"], d["max"]) == (1.0, 1.0, 61.0, 200.0)
    assert (d["over_60s"], d["over_180s"], d["within_60s_percent"]) == (2, 1, 99.8)


# -- an effect held to its contract alone (rules.BY_CONTRACT) ---------------------------------

POINTS = {"event_type": "ORDER_PAID", "step": "credit_points", "effect": "points", "provider": "loyalty",
          "contract": "replays", "keys_kept_for_seconds": 3600, "services": ["loyalty"]}
ORDER = "ORD-20261201-PTS1"


def _judged(step: dict | None, done: list[dict], *, local_outcome: str = "applied", calls=()) -> Counter:
    """What the checker finds of the points effect of one order whose PAID ran, given its step's row and
    what the provider did."""
    idem = {f"{ORDER}:ORDER_PAID:mark_paid": {"status": rules.DONE, "outcome": local_outcome}}
    if step is not None:
        idem[f"{ORDER}:ORDER_PAID:credit_points"] = step
    manifest = {"produced": [], "events_topic": "order-event", "effect_steps": [POINTS], "orders": {}}
    fakes = {"effects": {"points": {ORDER: done}}, "calls": list(calls)}
    books = Accountant(manifest, TopicRead(), TopicRead(), Tables(idem, {}, {}, [], 0), fakes, Findings())
    OrderCheck(books).by_contract(ORDER, POINTS)
    return books.f.counts


def _done(token: str) -> dict:
    return {"status": rules.DONE, "outcome": "points_credited", "idem_token": token}


def test_an_effect_held_by_its_contract_is_declared_checked_and_its_calls_known():
    assert rules.unchecked_effects([POINTS]) == [] and "loyalty" in rules.known_services([POINTS])
    assert rules.unchecked_effects([{**POINTS, "contract": "lookup"}])           # no rule for that one
    assert rules.unchecked_effects([{**POINTS, "services": []}])                  # no fake filing its effects
    assert rules.effect_steps([POINTS]) == {"ORDER_PAID": ["credit_points"]}


def test_an_effect_held_by_its_contract_passes_when_it_happened_once_under_its_token():
    calls = [{"service": "loyalty", "key": "T1", "body": {"order_no": ORDER}}] * 2
    assert _judged(_done("T1"), [{"reference": "PT1", "key": "T1"}], calls=calls) == Counter()
    assert _judged({"status": rules.FAILED, "outcome": "stale", "idem_token": None}, []) == Counter()   # voided
    assert _judged(None, [], local_outcome="stale") == Counter()                  # its event stale: never called


@pytest.mark.parametrize("step, done, calls, kind", [
    (_done("T1"), [{"reference": "PT1", "key": "T1"}, {"reference": "PT2", "key": "T1"}], (), "duplicate_effects"),
    (_done("T1"), [{"reference": "PT1", "key": "T9"}], (), "missing_effects"),      # not under its token
    (_done("T1"), [], (), "missing_effects"),                                        # done, nothing happened
    (None, [], (), "missing_effects"),                                               # applied, never called
    ({"status": rules.FAILED, "outcome": "stale", "idem_token": None}, [{"reference": "PT1", "key": "T1"}], (),
     "missing_effects"),                                                             # voided, yet it happened
    (_done("T1"), [{"reference": "PT1", "key": "T1"}],
     [{"service": "loyalty", "key": "T2", "body": {"order_no": ORDER}}], "misaccounted"),   # another token sent
])
def test_an_effect_held_by_its_contract_fails_the_run_when_it_did_not_happen_exactly_once(step, done, calls, kind):
    assert _judged(step, done, calls=calls)[kind] == 1
