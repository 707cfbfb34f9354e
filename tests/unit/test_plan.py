"""T1's decision, without a database: every branch of plan_batch."""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from app.pipeline.effect_cases import EffectCase, effect_case
from app.pipeline.errors import (
    AttemptsExhausted,
    KeyHorizonPassed,
    LeaseHeld,
    PayloadMismatch,
    PreconditionNotMet,
    UnknownOutcomeNonIdempotent,
)
from app.pipeline.events import EventType, decode
from app.pipeline.model import NOT_DELIVERED, STALE, IdemRow
from app.pipeline.plan import plan_batch, step_keys
from app.pipeline.states import IdemStatus, MoveVerdict, Order, OrderStatus, judge_move
from app.pipeline.steps import ISSUE_WAYBILL, PIPELINES, SEND_SMS, Contract, EffectStep
from harness.events import event, record

ME = "worker-a/1"
ORDER = "ORD-20261129-P0001"


def ev(type_: str, order: str = ORDER, **kw):
    return decode(*record(event(order, type_, **kw)), max_bytes=1 << 20)


def tokens():
    counter = itertools.count(1)
    return lambda key: f"tok-{next(counter)}"


# The shipped providers' contracts: the waybill's replays a repeated key, the SMS gateway answers lookups.
CONTRACTS = {ISSUE_WAYBILL.name: Contract.REPLAYS, SEND_SMS.name: Contract.LOOKUP}


def plan(events, rows=None, orders=None):
    return plan_batch(events, rows or {}, orders or {}, owner=ME, tokens=tokens(), contracts=CONTRACTS)


def row(key, e, status=IdemStatus.DONE, *, attempt=1, owner=ME, token=None, outcome="applied",
        expired=True, remaining=0.0, payload_hash=None):
    return IdemRow(key, status, attempt, owner, token, payload_hash or e.payload_hash, outcome, None,
                   expired, remaining)


def test_order_state_machine_table():
    S = OrderStatus
    legal = {(None, S.CREATED), (S.CREATED, S.PAID), (S.PAID, S.CONFIRMED), (S.CREATED, S.CANCELLED),
             (S.PAID, S.CANCELLED), (S.CONFIRMED, S.CANCELLED)}
    for current in [None, *S]:
        for target in S:
            verdict = judge_move(current, target)
            if (current, target) in legal:
                assert verdict is MoveVerdict.APPLY
            elif current is not None and current >= target:
                assert verdict is MoveVerdict.STALE, (current, target)
            else:
                assert verdict is MoveVerdict.NOT_READY, (current, target)
    assert judge_move(S.CANCELLED, S.CONFIRMED) is MoveVerdict.STALE          # the bug the design notes started from
    assert judge_move(S.PAID, S.CREATED) is MoveVerdict.STALE


def test_created_inserts_order_and_done_local_row():
    p = plan([ev("ORDER_CREATED")])
    assert p.events[0].outcome == "applied"
    assert p.orders[ORDER].status is OrderStatus.CREATED and ORDER in p.new_orders
    [new] = p.inserts
    assert new.status is IdemStatus.DONE and new.outcome == "applied" and new.step == "create_order"
    assert new.biz_key == f"{ORDER}:ORDER_CREATED:create_order"


def test_lifecycle_in_one_batch_collapses_to_final_state_with_one_job():
    events = [ev("ORDER_CREATED"), ev("ORDER_PAID"), ev("ORDER_CONFIRM")]
    p = plan(events)
    assert p.orders[ORDER].status is OrderStatus.CONFIRMED
    assert p.orders[ORDER].paid_cents == events[1].data["amount_cents"]
    [job] = p.events[2].jobs
    assert job.effect is ISSUE_WAYBILL and job.token == "tok-1" and job.attempt == 1
    assert job.request == {"order_no": ORDER, "address": events[0].data["address"]}
    pending = [r for r in p.inserts if r.status is IdemStatus.PENDING]
    assert [r.idem_token for r in pending] == ["tok-1"]


def test_paid_before_created_is_retriable_and_defers_the_order():
    other = "ORD-20261129-P0002"
    p = plan([ev("ORDER_PAID"), ev("ORDER_CONFIRM"), ev("ORDER_CREATED", order=other)])
    assert isinstance(p.events[0].error, PreconditionNotMet) and p.events[0].error.retriable
    assert p.events[1].deferred
    assert p.events[2].outcome == "applied"
    assert all(r.biz_key.startswith(other) for r in p.inserts)


def test_confirm_after_cancel_is_stale_and_calls_nothing():
    p = plan([ev("ORDER_CONFIRM")], orders={ORDER: Order(ORDER, OrderStatus.CANCELLED)})
    assert p.events[0].outcome == "stale" and not p.events[0].jobs
    assert ORDER not in p.orders
    [local] = p.inserts
    assert local.outcome == "stale"


def test_replay_of_done_event_is_a_duplicate_without_writes():
    e = ev("ORDER_PAID")
    rows = {k: row(k, e) for k in step_keys(e)}
    p = plan([e], rows, {ORDER: Order(ORDER, OrderStatus.PAID)})
    assert p.events[0].outcome == "duplicate" and not p.writes
    assert p.events[0].settled is None                               # its steps ran


def test_a_replay_whose_steps_ended_without_running_says_how():
    e = ev("ORDER_CONFIRM")
    local, effect = step_keys(e)
    for rows, settled in (({local: row(local, e, outcome="stale")}, "stale"),
                          ({local: row(local, e), effect: row(effect, e, IdemStatus.FAILED, outcome="stale")}, "stale"),
                          ({local: row(local, e), effect: row(effect, e, IdemStatus.FAILED,
                                                              outcome="discarded_by_person")}, "discarded_by_person")):
        p = plan([e], rows, {ORDER: Order(ORDER, OrderStatus.CANCELLED)})
        assert (p.events[0].outcome, p.events[0].settled) == ("duplicate", settled), rows


def _pending(*, owner=ME, expired=True, attempt=1, outcome=None, since_call=0.0, status=IdemStatus.PENDING,
             first_call_age=0.0):
    return IdemRow("k", status, attempt, owner, "t", "h", outcome, None, expired, 0.0 if expired else 9.0, since_call,
                   first_call_age)


DAY = 86400.0
# How long the shipped providers keep keys, as declared: the logistics API a day, the SMS gateway's lookup a week.
HORIZONS = {ISSUE_WAYBILL.name: DAY, SEND_SMS.name: 7 * DAY}


# (effect, row, recovering seconds, expected case): each row of the docs' t_idem table, with its
# waits and refusals, under IDEM_MAX_ATTEMPTS=5, a lookup of the SMS 30 s after an unknown outcome,
# and the logistics API, which cannot be asked.
EFFECT_CASES = [
    (ISSUE_WAYBILL, None, None, EffectCase.CLAIM),
    (SEND_SMS, None, None, EffectCase.CLAIM),
    (ISSUE_WAYBILL, None, 5.0, EffectCase.CLAIM),                       # idempotent: a recovery changes nothing
    (SEND_SMS, None, 5.0, EffectCase.RECOVERY_WAIT),
    (SEND_SMS, None, 30.0, EffectCase.CLAIM_LOOKED_UP),
    (SEND_SMS, _pending(status=IdemStatus.DONE, outcome="applied"), None, EffectCase.DONE),
    (SEND_SMS, _pending(status=IdemStatus.FAILED, outcome=STALE), None, EffectCase.SETTLED),
    (SEND_SMS, _pending(status=IdemStatus.FAILED, outcome="resolved_by_person"), None, EffectCase.SETTLED),
    (SEND_SMS, _pending(status=IdemStatus.FAILED, outcome="effect_rejected"), None, EffectCase.FAILED),
    (ISSUE_WAYBILL, _pending(owner="other/1", expired=False), None, EffectCase.HELD),
    (SEND_SMS, _pending(owner="other/1", expired=False, attempt=9), None, EffectCase.HELD),   # the lease first
    (ISSUE_WAYBILL, _pending(owner=ME, expired=False), None, EffectCase.RECLAIM),             # our own lease
    (ISSUE_WAYBILL, _pending(owner="dead/1"), None, EffectCase.RECLAIM),
    (ISSUE_WAYBILL, _pending(outcome="effect_unavailable"), None, EffectCase.RECLAIM),        # idempotent: again
    (ISSUE_WAYBILL, _pending(attempt=5), None, EffectCase.CAPPED),
    (SEND_SMS, _pending(attempt=5, since_call=99.0), None, EffectCase.CAPPED),                # the cap first
    (SEND_SMS, _pending(outcome=NOT_DELIVERED), None, EffectCase.RECLAIM),
    (SEND_SMS, _pending(since_call=10.0), None, EffectCase.UNKNOWN_WAIT),
    (SEND_SMS, _pending(since_call=30.0), None, EffectCase.RECLAIM_LOOKED_UP),
    # A recovery window: the store may hold an older state of a pending row (a restore), so every
    # pending SMS row is looked up, "not delivered" or not, once the window and its call have settled.
    (SEND_SMS, _pending(outcome=NOT_DELIVERED), 5.0, EffectCase.RECOVERY_WAIT),
    (SEND_SMS, _pending(outcome=NOT_DELIVERED), 30.0, EffectCase.RECLAIM_LOOKED_UP),
    (SEND_SMS, _pending(since_call=10.0), 30.0, EffectCase.UNKNOWN_WAIT),
    (SEND_SMS, _pending(since_call=99.0), 5.0, EffectCase.RECOVERY_WAIT),
    (SEND_SMS, _pending(owner="other/1", expired=False), 30.0, EffectCase.HELD),
    (ISSUE_WAYBILL, _pending(outcome=NOT_DELIVERED), 30.0, EffectCase.RECLAIM),   # idempotent: the token suffices
    # A provider's key horizon: past it, an earlier call that may have reached the provider makes a
    # repeat no replay. The logistics API cannot be asked: a person; the SMS gateway's lookup is asked.
    (ISSUE_WAYBILL, _pending(outcome="effect_unavailable", first_call_age=DAY - 1), None, EffectCase.RECLAIM),
    (ISSUE_WAYBILL, _pending(outcome="effect_unavailable", first_call_age=DAY + 1), None, EffectCase.PAST_HORIZON),
    (ISSUE_WAYBILL, _pending(outcome=None, first_call_age=DAY + 1), None, EffectCase.PAST_HORIZON),  # a worker died
    (ISSUE_WAYBILL, _pending(outcome=NOT_DELIVERED, first_call_age=9 * DAY), None, EffectCase.RECLAIM),  # never reached
    (ISSUE_WAYBILL, _pending(owner="other/1", expired=False, first_call_age=9 * DAY), None, EffectCase.HELD),
    (ISSUE_WAYBILL, _pending(attempt=5, first_call_age=9 * DAY), None, EffectCase.CAPPED),   # the cap first
    (SEND_SMS, _pending(since_call=10.0, first_call_age=8 * DAY), None, EffectCase.UNKNOWN_WAIT),
    (SEND_SMS, _pending(since_call=30.0, first_call_age=8 * DAY), None, EffectCase.RECLAIM_LOOKED_UP),
]


def test_each_effect_step_falls_in_the_case_its_row_says():
    seen = set()
    for effect, idem_row, recovering, expected in EFFECT_CASES:
        case = effect_case(effect, idem_row, contract=CONTRACTS[effect.name], owner=ME, attempt_cap=5,
                           verifiable={SEND_SMS.name: 30.0}, recovering=recovering, horizons=HORIZONS,
                           askable={SEND_SMS.name: 30.0})
        assert case is expected, (effect.name, idem_row, recovering)
        seen.add(case)
    assert effect_case(SEND_SMS, _pending(), contract=Contract.NONE, owner=ME, attempt_cap=5, verifiable={},
                       recovering=None) is EffectCase.UNKNOWN_UNASKABLE
    assert effect_case(SEND_SMS, _pending(outcome=NOT_DELIVERED), contract=Contract.NONE, owner=ME, attempt_cap=5, verifiable={},
                       recovering=30.0) is EffectCase.RECLAIM           # SMS_LOOKUP=false: a window cannot ask
    assert effect_case(ISSUE_WAYBILL, _pending(attempt=50), contract=Contract.REPLAYS, owner=ME, attempt_cap=None, verifiable={},
                       recovering=None) is EffectCase.RECLAIM        # no cap: a person asked for the run
    assert seen | {EffectCase.UNKNOWN_UNASKABLE} == set(EffectCase)


def test_pending_effect_with_expired_lease_is_reclaimed_with_the_same_token():
    e = ev("ORDER_CONFIRM")
    local, effect = step_keys(e)
    rows = {local: row(local, e), effect: row(effect, e, IdemStatus.PENDING, attempt=2, owner="dead/9",
                                                token="persisted", outcome=None, expired=True)}
    p = plan([e], rows, {ORDER: Order(ORDER, OrderStatus.CONFIRMED, address="x")})
    [job] = p.events[0].jobs
    assert job.token == "persisted" and job.attempt == 3
    assert [(r.biz_key, r.attempt) for r in p.reclaims] == [(effect, 2)]
    assert not p.inserts


def test_a_claim_looked_up_in_a_recovery_window_is_not_delivered_only_once_verified():
    """Its row must keep saying "ask first" when its call is not made: the claim the store forgot
    may have sent it under the same token."""
    cancel = ev("ORDER_CANCEL")
    _, sms = step_keys(cancel)
    paid = {ORDER: Order(ORDER, OrderStatus.PAID)}
    fresh = plan_batch([cancel], {}, paid, owner=ME, tokens=tokens(), verifiable={SEND_SMS.name: 30.0},
                       contracts=CONTRACTS, recovering=60.0)
    [job] = fresh.events[0].jobs
    assert job.verify and job.not_called_outcome() == "effect_outcome_unknown"
    rows = {step_keys(cancel)[0]: row(step_keys(cancel)[0], cancel),
            sms: row(sms, cancel, IdemStatus.PENDING, owner="dead/1", token="t", outcome=NOT_DELIVERED)}
    brought_back = plan_batch([cancel], rows, {ORDER: Order(ORDER, OrderStatus.CANCELLED)}, owner=ME,
                              tokens=tokens(), verifiable={SEND_SMS.name: 30.0}, contracts=CONTRACTS,
                              recovering=60.0)
    [job] = brought_back.events[0].jobs
    assert job.verify and job.not_called_outcome() == "effect_outcome_unknown"
    plain = plan_batch([cancel], rows, {ORDER: Order(ORDER, OrderStatus.CANCELLED)}, owner=ME, tokens=tokens(),
                       verifiable={SEND_SMS.name: 30.0}, contracts=CONTRACTS)
    [job] = plain.events[0].jobs
    assert not job.verify and job.not_called_outcome() == "effect_not_delivered"


def test_live_lease_of_another_worker_is_not_taken():
    e = ev("ORDER_CONFIRM")
    local, effect = step_keys(e)
    rows = {local: row(local, e), effect: row(effect, e, IdemStatus.PENDING, owner="other/1", token="t",
                                                outcome=None, expired=False, remaining=12.5)}
    p = plan([e, ev("ORDER_CANCEL")], rows, {ORDER: Order(ORDER, OrderStatus.CONFIRMED)})
    error = p.events[0].error
    assert isinstance(error, LeaseHeld) and error.wait_seconds == 12.5
    assert p.events[1].deferred
    assert not p.writes


def test_own_live_lease_is_renewed():
    e = ev("ORDER_CONFIRM")
    local, effect = step_keys(e)
    rows = {local: row(local, e), effect: row(effect, e, IdemStatus.PENDING, owner=ME, token="t",
                                                outcome="effect_unavailable", expired=False, remaining=20)}
    p = plan([e], rows, {ORDER: Order(ORDER, OrderStatus.CONFIRMED, address="x")})
    assert p.events[0].jobs[0].token == "t" and len(p.reclaims) == 1


def test_sms_is_not_called_again_after_an_unknown_outcome():
    e = ev("ORDER_CANCEL")
    local, effect = step_keys(e)
    rows = {local: row(local, e), effect: row(effect, e, IdemStatus.PENDING, owner="dead/1", outcome=None)}
    p = plan([e], rows, {ORDER: Order(ORDER, OrderStatus.CANCELLED, phone="1")})
    assert isinstance(p.events[0].error, UnknownOutcomeNonIdempotent)
    assert not p.events[0].jobs
    [fail] = p.fails
    assert (fail.biz_key, fail.attempt, fail.reason) == (effect, 1, "unknown_outcome_non_idempotent")


def test_sms_is_called_again_after_a_definite_non_delivery():
    e = ev("ORDER_CANCEL")
    local, effect = step_keys(e)
    rows = {local: row(local, e), effect: row(effect, e, IdemStatus.PENDING, owner="dead/1",
                                                outcome=NOT_DELIVERED)}
    p = plan([e], rows, {ORDER: Order(ORDER, OrderStatus.CANCELLED, phone="1")})
    [job] = p.events[0].jobs
    assert job.effect is SEND_SMS and job.attempt == 2 and job.request["phone"] == "1"


def test_failed_effect_replays_as_its_terminal_error():
    e = ev("ORDER_CONFIRM")
    local, effect = step_keys(e)
    rows = {local: row(local, e), effect: row(effect, e, IdemStatus.FAILED, outcome="effect_rejected")}
    p = plan([e], rows, {ORDER: Order(ORDER, OrderStatus.CONFIRMED)})
    error = p.events[0].error
    assert error.reason == "effect_rejected" and not error.retriable and not p.writes


def test_payload_mismatch_against_the_table_and_within_the_batch():
    e = ev("ORDER_PAID")
    other_payload = ev("ORDER_PAID", data={"amount_cents": 1})
    rows = {step_keys(e)[0]: row(step_keys(e)[0], e)}
    p = plan([other_payload], rows, {ORDER: Order(ORDER, OrderStatus.PAID)})
    assert isinstance(p.events[0].error, PayloadMismatch) and p.events[0].error.reason == "payload_mismatch"

    p = plan([ev("ORDER_CREATED"), e, ev("ORDER_PAID"), other_payload])
    assert [x.outcome for x in p.events[:3]] == ["applied", "applied", "duplicate"]
    assert isinstance(p.events[3].error, PayloadMismatch)


def test_dead_lettered_event_does_not_stop_later_events_of_its_order():
    e = ev("ORDER_PAID")
    rows = {step_keys(e)[0]: row(step_keys(e)[0], ev("ORDER_PAID", data={"amount_cents": 7}))}
    p = plan([e, ev("ORDER_CANCEL")], rows, {ORDER: Order(ORDER, OrderStatus.PAID)})
    assert isinstance(p.events[0].error, PayloadMismatch)
    assert p.events[1].jobs and p.orders[ORDER].status is OrderStatus.CANCELLED


TYPES = [t.value for t in EventType]


@hsettings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TYPES), min_size=1, max_size=8), st.integers(1, 8))
def test_one_batch_or_many_end_in_the_same_order_state(types, cut):
    """Splitting a stream into batches never changes the result, and ranks never go down."""
    events = [ev(t) for t in types]

    def run(batches):
        rows, orders, ranks = {}, {}, []
        for batch in batches:
            p = plan_batch(batch, rows, orders, owner=ME, tokens=tokens(), contracts=CONTRACTS)
            for new in p.inserts:
                rows[new.biz_key] = IdemRow(new.biz_key, new.status, 1, ME, new.idem_token, new.payload_hash,
                                            new.outcome, None, False, 1.0)
            orders.update(p.orders)
            if ORDER in orders:
                ranks.append(orders[ORDER].status)
            if any(x.error or x.deferred for x in p.events):
                return None   # a retriable failure stops the stream here either way
        return orders.get(ORDER), ranks

    whole = run([events])
    split = run([events[i:i + cut] for i in range(0, len(events), cut)])
    if whole is not None and split is not None:
        assert whole[0] == split[0]
        assert split[1] == sorted(split[1])


# -- no effect for an order that moved past the step's target ---------------------------

def test_a_waybill_claimed_with_a_cancel_later_in_the_batch_is_stale_and_not_called():
    p = plan([ev("ORDER_CONFIRM"), ev("ORDER_CANCEL")], orders={ORDER: Order(ORDER, OrderStatus.PAID, phone="1")})
    confirm, cancel = p.events
    assert confirm.outcome == "stale" and not confirm.jobs
    assert [j.effect for j in cancel.jobs] == [SEND_SMS]
    [waybill] = [r for r in p.inserts if r.step == "issue_waybill"]
    assert (waybill.status, waybill.outcome, waybill.idem_token) == (IdemStatus.FAILED, "stale", None)


def test_a_step_voided_only_by_the_states_it_names_is_called_past_its_target(monkeypatch):
    """A state past the target that the step does not name leaves its call standing (a shipped
    order still needs its waybill); by default every state past the target voids it."""
    confirm = PIPELINES[EventType.CONFIRM]
    [waybill] = confirm.effects
    assert EffectStep("any", ISSUE_WAYBILL).voids(OrderStatus.CONFIRMED) == {
        s for s in OrderStatus if s > OrderStatus.CONFIRMED}
    kept = replace(confirm, effects=(replace(waybill, voided_by=frozenset()),))
    monkeypatch.setitem(PIPELINES, EventType.CONFIRM, kept)
    p = plan([ev("ORDER_CONFIRM"), ev("ORDER_CANCEL")], orders={ORDER: Order(ORDER, OrderStatus.PAID, phone="1")})
    confirm_plan, cancel_plan = p.events
    assert [j.effect for j in confirm_plan.jobs] == [ISSUE_WAYBILL] and confirm_plan.outcome is None
    assert [j.effect for j in cancel_plan.jobs] == [SEND_SMS]


def test_a_pending_waybill_reclaimed_after_the_order_was_cancelled_is_failed_stale():
    """Never called again. If the last attempt surely did not reach the service, that is all;
    if it may have (a 5xx, a timeout, a worker that died mid-call), a waybill may exist for a
    cancelled order: the event goes to a person with the token to look for."""
    e = ev("ORDER_CONFIRM")
    local, effect = step_keys(e)
    for earlier, error in (("effect_not_delivered", None), ("effect_unavailable", "stale_effect_may_exist"),
                           (None, "stale_effect_may_exist")):
        rows = {local: row(local, e), effect: row(effect, e, IdemStatus.PENDING, attempt=3, owner="dead/1",
                                                    token="t", outcome=earlier, expired=True)}
        p = plan([e], rows, {ORDER: Order(ORDER, OrderStatus.CANCELLED)})
        [result] = p.events
        assert not result.jobs and not p.reclaims
        [fail] = p.fails
        assert (fail.biz_key, fail.attempt, fail.reason) == (effect, 3, "stale") and "CANCELLED" in fail.message
        if error is None:
            assert result.outcome == "stale" and result.error is None
        else:
            assert result.error.reason == error and not result.error.retriable and "token t" in str(result.error)


def test_a_held_lease_is_left_alone_even_when_the_order_moved_on():
    e = ev("ORDER_CONFIRM")
    local, effect = step_keys(e)
    rows = {local: row(local, e), effect: row(effect, e, IdemStatus.PENDING, owner="other/1", outcome=None,
                                                expired=False, remaining=5)}
    p = plan([e], rows, {ORDER: Order(ORDER, OrderStatus.CANCELLED)})
    assert isinstance(p.events[0].error, LeaseHeld) and not p.fails


def test_a_stale_effect_row_replays_as_a_duplicate_not_a_dead_letter():
    e = ev("ORDER_CONFIRM")
    local, effect = step_keys(e)
    rows = {local: row(local, e), effect: row(effect, e, IdemStatus.FAILED, outcome="stale")}
    p = plan([e], rows, {ORDER: Order(ORDER, OrderStatus.CANCELLED)})
    assert p.events[0].outcome == "duplicate" and p.events[0].error is None and not p.writes


def test_an_order_with_dead_letters_that_moves_flags_them_but_not_its_own_events():
    paid, cancel = ev("ORDER_PAID"), ev("ORDER_CANCEL")
    p = plan([paid, cancel], orders={ORDER: Order(ORDER, OrderStatus.CREATED, phone="1", has_dead_letters=True)})
    assert p.superseding == {ORDER}
    assert p.batch_keys == {step_keys(paid)[0], step_keys(cancel)[0]}
    p = plan([ev("ORDER_PAID")], orders={ORDER: Order(ORDER, OrderStatus.CREATED)})
    assert p.superseding == set()


# -- the attempt cap and the claim counts (the conflict rate's numerator and denominator) ------------------

def test_a_pending_row_claimed_as_often_as_the_cap_is_not_claimed_again():
    e = ev("ORDER_CONFIRM")
    local, effect = step_keys(e)
    rows = {local: row(local, e), effect: row(effect, e, IdemStatus.PENDING, attempt=20, owner="dead/9",
                                                token="persisted", outcome=None, expired=True)}
    orders = {ORDER: Order(ORDER, OrderStatus.CONFIRMED, address="x")}
    capped = plan_batch([e, ev("ORDER_CANCEL")], rows, orders, owner=ME, tokens=tokens(), contracts=CONTRACTS, attempt_cap=20)
    assert isinstance(capped.events[0].error, AttemptsExhausted) and not capped.events[0].error.retriable
    assert capped.events[1].deferred                   # the order's later events wait behind it
    assert not capped.writes and capped.claims == {"done": 1, "capped": 1}
    below = plan_batch([e], rows, orders, owner=ME, tokens=tokens(), contracts=CONTRACTS, attempt_cap=21)
    assert below.events[0].jobs[0].attempt == 21
    lifted = plan_batch([e], rows, orders, owner=ME, tokens=tokens(), contracts=CONTRACTS, attempt_cap=None)    # a person asked
    assert lifted.events[0].jobs[0].token == "persisted"


def test_claims_are_counted_by_what_they_found_and_replays_are_the_events_found_done():
    fresh, replayed, held = ev("ORDER_CREATED", "ORD-20261129-C1"), ev("ORDER_CONFIRM"), ev("ORDER_CONFIRM",
                                                                                            "ORD-20261129-C3")
    rows = {k: row(k, replayed) for k in step_keys(replayed)}
    hl, he = step_keys(held)
    rows |= {hl: row(hl, held), he: row(he, held, IdemStatus.PENDING, owner="other/1", token="t", outcome=None,
                                        expired=False, remaining=5)}
    orders = {o: Order(o, OrderStatus.CONFIRMED, address="x") for o in (ORDER, "ORD-20261129-C3")}
    p = plan([fresh, replayed, held], rows, orders)
    assert p.claims == {"new": 1, "done": 3, "held": 1}
    assert p.replayed == 1 and p.events[1].outcome == "duplicate"
    twice = plan([ev("ORDER_CREATED", "ORD-20261129-C4")] * 2)      # a duplicate inside one batch is not a replay
    assert twice.claims == {"new": 1} and twice.replayed == 0 and twice.events[1].outcome == "duplicate"


# A call in doubt (its outcome unknown, a minute ago) of an effect of each contract, its service
# named among those that can be asked: what happens follows from the contract, not from the name.
IN_DOUBT = {
    Contract.REPLAYS: EffectCase.RECLAIM,               # called again with its token: the first answer comes back
    Contract.REFUSES_DUPLICATES: EffectCase.RECLAIM,    # called again: a duplicate is refused, the first looked up
    Contract.LOOKUP: EffectCase.RECLAIM_LOOKED_UP,      # asked before any second call
    Contract.NONE: EffectCase.UNKNOWN_UNASKABLE,        # for a person
}


def test_a_call_in_doubt_is_decided_by_the_providers_contract():
    for contract, expected in IN_DOUBT.items():
        effect = replace(SEND_SMS, name="parcel")
        case = effect_case(effect, _pending(since_call=60.0), contract=contract, owner=ME, attempt_cap=5,
                           verifiable={"parcel": 30.0}, recovering=None)
        assert case is expected, contract
        # In a recovery window, only a lookup's fresh claim waits to ask; the others claim.
        fresh = effect_case(effect, None, contract=contract, owner=ME, attempt_cap=5, verifiable={"parcel": 30.0},
                            recovering=5.0)
        assert fresh is (EffectCase.RECOVERY_WAIT if contract is Contract.LOOKUP else EffectCase.CLAIM), contract
    assert set(IN_DOUBT) == set(Contract)
    assert [c for c in Contract if c.idempotent] == [Contract.REPLAYS, Contract.REFUSES_DUPLICATES]


def test_past_its_key_horizon_an_idempotent_call_in_doubt_is_asked_about_or_left_to_a_person():
    """A courier that refuses duplicates and can look a reference up (the express courier): asked
    once its settle has passed. Without a lookup: a person. A key still kept: called again, as ever."""
    express = dict(contract=Contract.REFUSES_DUPLICATES, owner=ME, attempt_cap=5, verifiable={}, recovering=None,
                   horizons={ISSUE_WAYBILL.name: DAY})
    old = _pending(outcome="effect_unavailable", first_call_age=DAY + 1, since_call=60.0)
    assert effect_case(ISSUE_WAYBILL, old, askable={ISSUE_WAYBILL.name: 30.0}, **express) is EffectCase.RECLAIM_LOOKED_UP
    assert effect_case(ISSUE_WAYBILL, replace(old, since_call=5.0), askable={ISSUE_WAYBILL.name: 30.0},
                       **express) is EffectCase.UNKNOWN_WAIT
    assert effect_case(ISSUE_WAYBILL, old, askable={}, **express) is EffectCase.PAST_HORIZON
    assert effect_case(ISSUE_WAYBILL, old, askable={}, **{**express, "horizons": {}}) is EffectCase.RECLAIM   # for ever
    assert effect_case(ISSUE_WAYBILL, replace(old, first_call_age=DAY - 1), askable={},
                       **express) is EffectCase.RECLAIM


def _past(effect_key, e, *, since_call=60.0):
    return IdemRow(effect_key, IdemStatus.PENDING, 3, "dead/1", "tok-first", e.payload_hash, "effect_unavailable", None,
                   True, 0.0, since_call, 2 * DAY + 60)


def test_a_waybill_past_its_key_horizon_is_not_claimed_and_goes_to_a_person_with_the_facts():
    e = ev("ORDER_CONFIRM")
    local, effect = step_keys(e)
    rows = {local: row(local, e), effect: _past(effect, e)}
    orders = {ORDER: Order(ORDER, OrderStatus.CONFIRMED, address="x")}
    p = plan_batch([e, ev("ORDER_CANCEL")], rows, orders, owner=ME, tokens=tokens(), contracts=CONTRACTS,
                   horizons=HORIZONS, attempt_cap=None)            # a person's retry meets it too
    error = p.events[0].error
    assert isinstance(error, KeyHorizonPassed) and not error.retriable and not error.fails_step
    assert not p.events[0].jobs and not p.writes and p.claims == {"done": 1, "past_horizon": 1}
    assert p.events[1].deferred                                    # the order's later events wait behind it
    for fact in ("2d 0h ago", "for 24h", "EFFECTS__WAYBILL__KEYS_KEPT_FOR_SECONDS", "tok-first", ORDER,
                 "reconcile --last 50h"):
        assert fact in str(error), (fact, str(error))


def test_a_lookup_past_the_key_horizon_sends_nothing_when_it_finds_nothing():
    """The SMS gateway's lookup is asked as ever; its job says why a "not found" proves nothing."""
    cancel = ev("ORDER_CANCEL")
    local, sms = step_keys(cancel)
    rows = {local: row(local, cancel), sms: _past(sms, cancel)}
    orders = {ORDER: Order(ORDER, OrderStatus.CANCELLED)}
    p = plan_batch([cancel], rows, orders, owner=ME, tokens=tokens(), contracts=CONTRACTS, horizons={"sms": DAY},
                   verifiable={"sms": 30.0}, askable={"sms": 30.0})
    [job] = p.events[0].jobs
    assert job.verify and job.token == "tok-first" and job.attempt == 4
    assert job.past_horizon is not None and "keeps idempotency keys for 24h" in job.past_horizon
    inside = plan_batch([cancel], rows, orders, owner=ME, tokens=tokens(), contracts=CONTRACTS,
                        horizons={"sms": 7 * DAY}, verifiable={"sms": 30.0}, askable={"sms": 30.0})
    [job] = inside.events[0].jobs
    assert job.verify and job.past_horizon is None                 # not found: sent, as ever
