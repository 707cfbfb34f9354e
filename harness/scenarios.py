"""One table of the processor's scenarios, run on both stores: the in-memory one
(``tests/unit/test_processor_scenarios.py``, no MariaDB, milliseconds) and MariaDB
(``tests/integration/test_store_scenarios.py``). The memory store is trusted in unit
tests only because it passes the same table as the real one.

A scenario is an ``async def`` taking a harness: processors, an in-memory effect
client (a logistics API that deduplicates by token, an SMS gateway that does not),
a clock (``pass_time``: the memory store's, or real seconds), and reads of the rows.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta

from app.pipeline.clock import Clock
from app.pipeline.errors import (
    AttemptsExhausted,
    BeyondDedupRetention,
    ClaimExpiring,
    EffectNotDelivered,
    EffectOutcomeUnknown,
    EffectUnavailable,
    KeyHorizonPassed,
    LeaseHeld,
    PayloadMismatch,
    PipelineError,
    StoreUnavailable,
    UnknownOutcomeNonIdempotent,
)
from app.pipeline.events import EventType
from app.pipeline.liveness_fence import SelfFence
from app.pipeline.model import EffectJob
from app.pipeline.outcomes import Outcome
from app.pipeline.ports import DeadLetter, Finished, Receipt, SourceRecord
from app.pipeline.processor import Processor, ProcessorPolicy, Safeguards
from app.pipeline.retention import Retention
from app.pipeline.states import IdemStatus, OrderStatus
from app.pipeline.steps import ISSUE_WAYBILL, PIPELINES, SEND_SMS, Contract, EffectStep, LocalStep, Pipeline
from app.pipeline.tokens import StepTokens
from harness.events import order_no
from harness.pipeline import ev

_owners = itertools.count(1)
REFERENCE_PREFIX = {"waybill": "WB", "sms": "SMS"}     # how the services number what they made


class Fault:
    """What the next call of an effect does instead of succeeding."""

    def __init__(self, error: PipelineError, *, after_work: bool = False) -> None:
        self.error, self.after_work = error, after_work


class Crash(BaseException):
    """The worker died right here (nothing after it ran: no T3, no ack)."""


class MemoryEffects:
    """The ``EffectClient`` port in memory, for every declared effect by its provider's contract
    (``contracts``: the shipped ones unless a scenario says otherwise): an idempotent effect's
    service deduplicates by our token (a waybill), any other does the work again on every call (an
    SMS), and answers lookups by the token when ``verifiable`` says so."""

    def __init__(self, wait: Callable[[float], Awaitable[None]]) -> None:
        self.wait = wait                                          # a call that takes time waits on the harness's clock
        self.verifiable: dict[str, float] = {}                    # effect -> settle seconds, as EffectClients has it
        self.askable: dict[str, float] = {}                       # the same, for every effect that can be looked up
        self.horizons: dict[str, float] = {}                      # effect -> how long its provider keeps keys
        self.contracts: dict[str, Contract] = {"waybill": Contract.REPLAYS, "sms": Contract.LOOKUP}
        self.crash: str | None = None                             # "before_send" or "after_send", once
        self.accepted_refs: dict[str, str] = {}
        self.lookups: list[str] = []
        self.faults: defaultdict[str, list[Fault]] = defaultdict(list)   # effect -> its next calls' faults
        self.delay: dict[str, float] = {}
        self.lookup_delay = 0.0                                   # how long a lookup takes (the harness's clock)
        self.calls: list[tuple[str, str, str]] = []              # (effect, order_no, token)
        self.reference_by_token: dict[str, str] = {}             # an idempotent effect's answer per token
        self.sent: Counter = Counter()                            # work actually done, per (effect, order_no)
        self.in_flight: Counter = Counter()
        self.peak_in_flight = 0
        self._serial = itertools.count(1)

    async def call(self, job: EffectJob) -> Receipt:
        name = job.effect.name
        self.calls.append((name, job.order_no, job.token))
        self.in_flight[job.biz_key] += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight[job.biz_key])
        try:
            if self.delay.get(name):
                await self.wait(self.delay[name])
            fault = self.faults[name].pop(0) if self.faults[name] else None
            if fault is not None and not fault.after_work:
                raise fault.error
            crash, self.crash = self.crash, None
            if crash == "before_send":
                raise Crash()
            receipt = self._work(job)
            if crash == "after_send":
                raise Crash()
            if fault is not None:
                raise fault.error
            return receipt
        finally:
            self.in_flight[job.biz_key] -= 1

    def _work(self, job: EffectJob) -> Receipt:
        name = job.effect.name
        prefix = REFERENCE_PREFIX.get(name, name.upper())
        if self.contracts.get(job.effect.name, Contract.NONE).idempotent:
            if job.token not in self.reference_by_token:
                self.reference_by_token[job.token] = f"{prefix}{next(self._serial):08d}"
                self.sent[name, job.order_no] += 1
            return Receipt(reference=self.reference_by_token[job.token])
        self.sent[name, job.order_no] += 1
        reference = f"{prefix}{next(self._serial):08d}"
        self.accepted_refs[job.token] = reference
        return Receipt(reference=reference)

    async def lookup(self, job: EffectJob) -> Receipt | None:
        self.lookups.append(job.token)
        if self.lookup_delay:
            await self.wait(self.lookup_delay)
        found = self.accepted_refs.get(job.token) or self.reference_by_token.get(job.token)
        return None if found is None else Receipt(reference=found)

    def forget_keys(self) -> None:
        """The providers of idempotent effects forget every key they were sent (their records stay:
        a lookup still finds what they did); a key sent again is a new request to them."""
        self.accepted_refs.update(self.reference_by_token)
        self.reference_by_token.clear()


class Harness:
    """What a scenario sees; ``MemoryHarness`` and ``MySqlHarness`` fill it in."""

    effects: MemoryEffects

    def new_store(self):
        raise NotImplementedError

    def clock(self) -> Callable[[], float]:
        raise NotImplementedError

    async def pass_time(self, seconds: float) -> None:
        """Let ``seconds`` go by (the memory store's clock moves; MariaDB's just runs)."""
        raise NotImplementedError

    async def wait(self, seconds: float) -> None:
        """Wait until ``seconds`` have gone by (on the memory clock: until somebody moves it)."""
        raise NotImplementedError

    def idem(self, key: str) -> dict | None:
        raise NotImplementedError

    def order(self, order: str) -> dict | None:
        raise NotImplementedError

    def receipt(self, order: str) -> dict | None:
        raise NotImplementedError

    def ledger(self, topic: str) -> list[dict]:
        raise NotImplementedError

    def backup(self, order: str):
        """What a backup taken now holds of ``order`` (its t_idem rows, its order row, its receipt)."""
        raise NotImplementedError

    def restore(self, backup) -> None:
        """Put ``order`` back as :meth:`backup` found it: everything written since is forgotten."""
        raise NotImplementedError

    def open_recovery_window(self, age: float = 0.0) -> None:
        """A recovery window opened ``age`` seconds ago (the CLI's ``recovery start``)."""
        raise NotImplementedError

    def end_recovery_window(self) -> None:
        """Every open window ended (the CLI's ``recovery end``)."""
        raise NotImplementedError

    def processor(self, *, lease: float = 30.0, owner: str | None = None, lease_check: bool = True,
                  store=None, attempt_cap: int | None = None, retention: Retention | None = None,
                  dead_after: float | None = None) -> Processor:
        """``dead_after``: the processor beats (``beat``), and claims of owners that stopped beating
        are taken over (``app.pipeline.liveness_fence``)."""
        policy = ProcessorPolicy(lease_seconds=lease, effect_concurrency=64, effect_timeout=1.0 if lease_check else 0.0,
                                 attempt_cap=attempt_cap)
        return Processor(store or self.store, self.effects, owner=owner or f"scenario-{next(_owners)}/main/x",
                         tokens=StepTokens(b"scenarios"), policy=policy, clock=Clock(self.clock()),
                         safeguards=Safeguards(fence=None if dead_after is None else SelfFence(dead_after),
                                               retention=retention))

    def beat(self, p: Processor) -> None:
        """``p``'s process writes its heartbeat now, and it got through."""
        raise NotImplementedError

    def late_caller(self, p: Processor, owner: str, *, lease: float = 1.5, late: float = 0.8) -> Processor:
        """A processor sharing ``p``'s store whose calls start ``late`` seconds after its T1 (e.g.
        waiting for a concurrency slot), with a ``lease`` so short that a call of 1 s no longer fits."""
        harness = self

        class Late(Processor):
            async def _t2(self, run, jobs):
                await harness.pass_time(late)
                return await super()._t2(run, jobs)

        return Late(p.store, self.effects, owner=owner, tokens=p.tokens, clock=Clock(self.clock()),
                    policy=ProcessorPolicy(lease_seconds=lease, effect_concurrency=1, effect_timeout=1.0))

    async def paid(self, p: Processor, n: int = 1) -> list[str]:
        orders = [order_no(prefix="SCN") for _ in range(n)]
        results = await p.run([ev(o, t) for o in orders for t in ("ORDER_CREATED", "ORDER_PAID")])
        assert all(r.outcome is Outcome.APPLIED for r in results), results
        return orders


def key(order: str, type_: str, step: str) -> str:
    return f"{order}:{type_}:{step}"


@contextmanager
def declared(event_type: EventType, pipeline: Pipeline):
    """Run with ``pipeline`` declared for ``event_type``, as a future step list might."""
    before = PIPELINES[event_type]
    PIPELINES[event_type] = pipeline
    try:
        yield
    finally:
        PIPELINES[event_type] = before


# -- the scenarios ------------------------------------------------------------------------

async def a_stalled_owner_is_fenced_out_by_attempt(h: Harness) -> None:
    """A claims with a 0.3 s lease and stalls in its call past it; B claims again
    (attempt 2, same token) and finishes; A's T3 matches nothing: superseded."""
    a = h.processor(lease=0.3, owner="a/main/1", lease_check=False)
    b = h.processor(lease=30, owner="b/main/1")
    [order] = await h.paid(a)
    confirm = ev(order, "ORDER_CONFIRM")
    h.effects.delay["waybill"] = 1.0
    first = asyncio.create_task(a.run([confirm]))
    while not h.effects.calls:                                     # A is in its call (1 s)...
        await asyncio.sleep(0.01)
    h.effects.delay.clear()
    await h.pass_time(0.6)                                         # ...past its lease (0.3 s)
    [second] = await b.run([confirm])
    await h.pass_time(0.6)                                         # A's call ends
    [stale] = await first
    assert (stale.outcome, second.outcome) == (Outcome.SUPERSEDED, Outcome.APPLIED)
    row = h.idem(key(order, "ORDER_CONFIRM", "issue_waybill"))
    assert (row["status"], row["attempt"], row["owner"]) == (IdemStatus.DONE, 2, "b/main/1")
    assert h.receipt(order)["attempt"] == 2
    assert h.effects.sent["waybill", order] == 1 and len({c[2] for c in h.effects.calls if c[1] == order}) == 1


async def a_live_lease_is_not_taken(h: Harness) -> None:
    a = h.processor(owner="a/main/2")
    b = h.processor(owner="b/main/2")
    [order] = await h.paid(a)
    h.effects.faults["waybill"].append(Fault(EffectUnavailable("503")))
    [first] = await a.run([ev(order, "ORDER_CONFIRM")])
    assert isinstance(first.error, EffectUnavailable)
    [other] = await b.run([ev(order, "ORDER_CONFIRM")])
    assert isinstance(other.error, LeaseHeld) and other.error.wait_seconds > 0
    [again] = await a.run([ev(order, "ORDER_CONFIRM")])            # its own lease: renewed
    assert again.outcome is Outcome.APPLIED
    tokens = {c[2] for c in h.effects.calls if c[1] == order}
    assert len(tokens) == 1 and h.effects.sent["waybill", order] == 1


async def a_skipped_call_is_noted_and_made_on_the_retry(h: Harness) -> None:
    """Two effects of one event, the first fails: the second was never called, T3 says
    so (effect_not_delivered), and the re-run sends even the SMS, once."""
    two_effects = Pipeline(LocalStep("mark_cancelled", OrderStatus.CANCELLED, sets={"cancel_reason": "reason"}),
                           effects=(EffectStep("recall_parcel", ISSUE_WAYBILL), EffectStep("send_cancel_sms", SEND_SMS)))
    with declared(EventType.CANCEL, two_effects):
        p = h.processor()
        [order] = await h.paid(p)
        h.effects.faults["waybill"].append(Fault(EffectUnavailable("503")))
        [first] = await p.run([ev(order, "ORDER_CANCEL")])
        assert isinstance(first.error, EffectUnavailable)
        row = h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms"))
        assert (row["status"], row["outcome"]) == (IdemStatus.PENDING, "effect_not_delivered")
        [second] = await p.run([ev(order, "ORDER_CANCEL")])
        assert second.outcome is Outcome.APPLIED and h.effects.sent["sms", order] == 1


async def an_sms_with_an_unknown_outcome_is_never_sent_again(h: Harness) -> None:
    p = h.processor()
    [order] = await h.paid(p)
    h.effects.faults["sms"].append(Fault(UnknownOutcomeNonIdempotent("reset after sending"), after_work=True))
    [first] = await p.run([ev(order, "ORDER_CANCEL")])
    assert first.error.reason == "unknown_outcome_non_idempotent" and not first.error.retriable
    [again] = await p.run([ev(order, "ORDER_CANCEL")])
    assert again.error.reason == "unknown_outcome_non_idempotent"
    assert h.effects.sent["sms", order] == 1 and sum(c[0] == "sms" for c in h.effects.calls) == 1
    assert h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms"))["status"] == IdemStatus.FAILED


async def a_pending_waybill_of_a_cancelled_order_is_stale(h: Harness) -> None:
    p = h.processor()
    [order] = await h.paid(p)
    h.effects.faults["waybill"].append(Fault(EffectUnavailable("503")))
    await p.run([ev(order, "ORDER_CONFIRM")])
    [cancel] = await p.run([ev(order, "ORDER_CANCEL")])
    [confirm] = await p.run([ev(order, "ORDER_CONFIRM")])
    # Not called again; the 503 may have issued one, so a person is asked to look.
    assert cancel.outcome is Outcome.APPLIED and confirm.error.reason == "stale_effect_may_exist"
    row = h.idem(key(order, "ORDER_CONFIRM", "issue_waybill"))
    assert (row["status"], row["outcome"]) == (IdemStatus.FAILED, "stale")
    assert sum(c[0] == "waybill" for c in h.effects.calls) == 1 and h.order(order)["status"] == OrderStatus.CANCELLED
    [replay] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert replay.outcome is Outcome.DUPLICATE and replay.error is None     # settled: one dead letter, not one a replay


async def a_payment_after_the_cancel_is_stale_but_recorded(h: Harness) -> None:
    """The status stays CANCELLED, but the order shows it was paid (a refund needs it): the
    same row as when the payment came first."""
    p = h.processor()
    late, early = order_no(prefix="SCN"), order_no(prefix="SCN")
    await p.run([ev(late, "ORDER_CREATED"), ev(late, "ORDER_CANCEL")])
    [paid] = await p.run([ev(late, "ORDER_PAID", data={"amount_cents": 4_200})])
    [again] = await p.run([ev(late, "ORDER_PAID", data={"amount_cents": 4_200})])
    await p.run([ev(early, "ORDER_CREATED"), ev(early, "ORDER_PAID", data={"amount_cents": 4_200}),
                 ev(early, "ORDER_CANCEL")])
    assert paid.outcome is Outcome.STALE and again.outcome is Outcome.DUPLICATE
    fields = ("status", "paid_cents", "cancel_reason")
    assert [h.order(late)[f] for f in fields] == [h.order(early)[f] for f in fields]
    assert h.order(late)["status"] == OrderStatus.CANCELLED and h.order(late)["paid_cents"] == 4_200
    assert h.effects.sent["sms", late] == 1


async def a_claim_without_enough_lease_left_is_not_called(h: Harness) -> None:
    """The lease is checked right before the call, on the processor's clock from T1."""
    p = h.processor(lease=1.5)                                       # a call may take 1 s
    [order] = await h.paid(p)

    slow = h.late_caller(p, p.owner)
    [first] = await slow.run([ev(order, "ORDER_CONFIRM")])
    assert isinstance(first.error, ClaimExpiring) and h.effects.calls == []
    assert h.idem(key(order, "ORDER_CONFIRM", "issue_waybill"))["outcome"] == "effect_not_delivered"
    [second] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert second.outcome is Outcome.APPLIED and h.effects.sent["waybill", order] == 1


async def a_t3_run_twice_counts_its_own_rows_and_writes_one_receipt(h: Harness) -> None:
    """The commit of a T3 was lost, so it runs again with the same outcomes."""
    p = h.processor()
    [order] = await h.paid(p)
    plan = await p.store.in_transaction(lambda tx: p._t1(tx, [ev(order, "ORDER_CONFIRM")]))
    [job] = plan.events[0].jobs
    finished = [Finished(job, receipt=Receipt(reference="WB-1"))]
    for _ in range(2):
        owned = await p.store.in_transaction(lambda tx: tx.finish_effects(finished, owner=p.owner))
        assert owned == {job.biz_key}
    assert h.receipt(order)["waybill_no"] == "WB-1"
    assert h.idem(job.biz_key)["status"] == IdemStatus.DONE


async def a_replayed_batch_is_all_duplicates_and_a_new_payload_is_refused(h: Harness) -> None:
    p = h.processor()
    orders = await h.paid(p, 3)
    again = await p.run([ev(o, "ORDER_CREATED") for o in orders])
    assert [r.outcome for r in again] == [Outcome.DUPLICATE] * 3
    [other] = await p.run([ev(orders[0], "ORDER_PAID", data={"amount_cents": 1})])
    assert isinstance(other.error, PayloadMismatch)


async def the_ledger_keeps_one_row_per_record_and_flags_overtaken_letters(h: Harness) -> None:
    p = h.processor()
    [order] = await h.paid(p)
    topic = f"scenario-{order}"[:60]
    record = SourceRecord(topic, 0, 7, 1000, order.encode(), b"{}")
    letter = DeadLetter(record=record, reason="effect_unavailable", message="503", retriable=True, attempts=4,
                        first_failure_at=datetime.now(UTC), order_no=order,
                        biz_key=key(order, "ORDER_CONFIRM", "mark_confirmed"))
    for group in ("g1", "g1", "g2"):
        await p.store.in_transaction(lambda tx, group=group: tx.record_dead_letters([letter], group=group))
    assert sorted(row["may_be_superseded"] for row in h.ledger(topic)) == [0, 0]
    await p.run([ev(order, "ORDER_CANCEL")])                           # a later batch moves the order
    assert sorted(row["may_be_superseded"] for row in h.ledger(topic)) == [1, 1]
    assert not h.order(order)["has_dead_letters"]


async def a_lost_sms_reply_is_looked_up_and_never_sent_again(h: Harness) -> None:
    h.effects.verifiable = {"sms": 0.5}
    p = h.processor()
    [order] = await h.paid(p)
    h.effects.faults["sms"].append(Fault(EffectOutcomeUnknown("reset after sending"), after_work=True))
    [first] = await p.run([ev(order, "ORDER_CANCEL")])
    assert first.error.reason == "effect_outcome_unknown" and first.error.retriable
    [early] = await p.run([ev(order, "ORDER_CANCEL")])              # a request may still be on its way
    assert isinstance(early.error, EffectOutcomeUnknown) and h.effects.lookups == []
    await h.pass_time(0.6)
    [later] = await p.run([ev(order, "ORDER_CANCEL")])
    assert later.outcome is Outcome.APPLIED and h.effects.sent["sms", order] == 1 and len(h.effects.lookups) == 1
    assert h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms"))["status"] == IdemStatus.DONE


async def an_sms_that_never_arrived_is_looked_up_and_sent_once(h: Harness) -> None:
    h.effects.verifiable = {"sms": 0.5}
    p = h.processor()
    [order] = await h.paid(p)
    h.effects.faults["sms"].append(Fault(EffectOutcomeUnknown("503 before anything was done")))
    await p.run([ev(order, "ORDER_CANCEL")])
    await h.pass_time(0.6)
    [later] = await p.run([ev(order, "ORDER_CANCEL")])
    assert later.outcome is Outcome.APPLIED and h.effects.sent["sms", order] == 1
    tokens = {c[2] for c in h.effects.calls if c[1] == order}
    assert len(tokens) == 1 and h.effects.lookups == list(tokens)   # the same client_ref, asked, then sent


async def a_crash_between_the_lookup_and_the_send_is_looked_up_again(h: Harness) -> None:
    """Worker A asks the gateway (404) and dies before sending; B asks again and sends. Then
    the other window: A asks, sends, and dies before recording it; B asks and finds it."""
    h.effects.verifiable = {"sms": 0.5}
    a = h.processor(lease=0.3, owner="a/main/3", lease_check=False)
    b = h.processor(owner="b/main/3")
    for crash in ("before_send", "after_send"):
        [order] = await h.paid(a)
        h.effects.faults["sms"].append(Fault(EffectOutcomeUnknown("503 before anything was done")))
        await a.run([ev(order, "ORDER_CANCEL")])
        await h.pass_time(0.6)
        h.effects.crash = crash
        try:
            await a.run([ev(order, "ORDER_CANCEL")])
            raise AssertionError("the worker should have died")
        except Crash:
            pass
        # A's lease (0.3 s) runs out, then the gateway settles (0.5 s): A may have sent until its
        # lease ended, so the settle counts from there.
        await h.pass_time(0.9)
        [result] = await b.run([ev(order, "ORDER_CANCEL")])
        assert result.outcome is Outcome.APPLIED, (crash, result)
        assert h.effects.sent["sms", order] == 1, crash
        assert h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms"))["status"] == IdemStatus.DONE


async def an_sms_sent_before_a_crash_stays_unknown_when_the_next_claim_is_not_called(h: Harness) -> None:
    """A sends and dies before T3; B re-claims but has too little lease left to call. B's "not
    called" is true of B's attempt only: the row must stay unknown, so C asks the gateway and
    finds the message instead of sending it again (found by the chaos suite: two SMS)."""
    h.effects.verifiable = {"sms": 0.5}
    a = h.processor(lease=0.3, owner="a/main/4", lease_check=False)
    [order] = await h.paid(a)
    h.effects.crash = "after_send"
    try:
        await a.run([ev(order, "ORDER_CANCEL")])
        raise AssertionError("the worker should have died")
    except Crash:
        pass
    await h.pass_time(0.9)                              # A's lease runs out (0.3 s), then the gateway settles

    b = h.late_caller(a, "b/main/4")
    [late] = await b.run([ev(order, "ORDER_CANCEL")])
    assert isinstance(late.error, ClaimExpiring) and h.effects.sent["sms", order] == 1
    assert h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms"))["outcome"] == "effect_outcome_unknown"
    await h.pass_time(1.6)                                          # B's lease runs out too
    [result] = await h.processor(owner="c/main/4").run([ev(order, "ORDER_CANCEL")])
    assert result.outcome is Outcome.APPLIED and h.effects.sent["sms", order] == 1 and h.effects.lookups


async def a_lookup_that_took_the_lease_leaves_the_send_to_the_next_claim(h: Harness) -> None:
    """A slow lookup (404) leaves the claim too little lease for the send: it is not sent now
    (another claimer may take the key as soon as the lease ends, and two sends of one SMS would
    be in flight). The lookup verified that no earlier call reached the gateway, so the row says
    "not delivered" now, and the next claim sends once without asking again."""
    h.effects.verifiable = {"sms": 0.5}
    p = h.processor(lease=3.0)
    [order] = await h.paid(p)
    h.effects.faults["sms"].append(Fault(EffectOutcomeUnknown("503 before anything was done")))
    await p.run([ev(order, "ORDER_CANCEL")])
    await h.pass_time(0.6)
    h.effects.lookup_delay = 2.5                                     # of a 3 s lease; a call needs 1 s
    running = asyncio.create_task(p.run([ev(order, "ORDER_CANCEL")]))
    while not h.effects.lookups:
        await asyncio.sleep(0.01)
    await h.pass_time(2.5)
    [short] = await running
    assert isinstance(short.error, ClaimExpiring) and "after the lookup" in str(short.error), short
    assert h.effects.sent["sms", order] == 0 and len(h.effects.lookups) == 1
    assert h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms"))["outcome"] == "effect_not_delivered"
    h.effects.lookup_delay = 0.0
    await h.pass_time(1.1)
    [result] = await h.processor(owner="next/main/5").run([ev(order, "ORDER_CANCEL")])
    assert result.outcome is Outcome.APPLIED and h.effects.sent["sms", order] == 1 and len(h.effects.lookups) == 1


async def an_order_older_than_the_retention_is_refused_and_leaves_no_trace(h: Harness) -> None:
    """Its t_idem rows may have been dropped with their partition: running it could repeat an effect."""
    today = date(2026, 11, 30)
    p = h.processor(retention=Retention(90, today=lambda: today))
    old, edge = (order_no(day=f"{day:%Y%m%d}", prefix="SCN") for day in (today - timedelta(days=91),
                                                                       today - timedelta(days=90)))
    results = await p.run([ev(o, t) for o in (old, edge) for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")])
    assert all(isinstance(r.error, BeyondDedupRetention) and not r.error.retriable for r in results[:3]), results
    assert [r.outcome for r in results[3:]] == [Outcome.APPLIED] * 3
    assert h.idem(key(old, "ORDER_CREATED", "create_order")) is None and h.order(old) is None
    assert [c[1] for c in h.effects.calls] == [edge]


async def a_key_claimed_as_often_as_the_cap_is_left_to_a_person(h: Harness) -> None:
    """Three claims that failed, then no fourth automatically; a person's run may claim it again."""
    p = h.processor(attempt_cap=3)
    [order] = await h.paid(p)
    h.effects.faults["waybill"] += [Fault(EffectUnavailable("503")) for _ in range(3)]
    for _ in range(3):
        [failed] = await p.run([ev(order, "ORDER_CONFIRM")])
        assert isinstance(failed.error, EffectUnavailable), failed
    capped, behind = await p.run([ev(order, "ORDER_CONFIRM"), ev(order, "ORDER_CANCEL")])
    assert isinstance(capped.error, AttemptsExhausted) and not capped.error.retriable
    assert behind.deferred                                  # the order's next event waits behind it
    assert len(h.effects.calls) == 3
    row = h.idem(key(order, "ORDER_CONFIRM", "issue_waybill"))
    assert (row["status"], row["attempt"]) == (IdemStatus.PENDING, 3)
    [done] = await p.run([ev(order, "ORDER_CONFIRM")], by_person=True)
    assert done.outcome is Outcome.APPLIED and h.receipt(order)["attempt"] == 4
    assert h.effects.sent["waybill", order] == 1 and len({c[2] for c in h.effects.calls}) == 1


async def a_restore_from_backup_asks_the_services_the_same_questions_again(h: Harness) -> None:
    """The store goes back to a backup taken before the waybill and the SMS; the replay, in a
    recovery window, derives the same tokens: the logistics API answers with the waybill it
    issued, and the gateway's lookup finds the SMS: nothing is issued or sent twice."""
    h.effects.verifiable = {"sms": 0.5}
    p = h.processor()
    [order] = await h.paid(p)
    backup = h.backup(order)
    done = [r for t in ("ORDER_CONFIRM", "ORDER_CANCEL") for r in await p.run([ev(order, t)])]
    assert all(r.outcome is Outcome.APPLIED for r in done), done
    assert h.effects.sent["waybill", order] == 1 and h.effects.sent["sms", order] == 1
    h.restore(backup)
    assert h.order(order)["status"] == OrderStatus.PAID and h.idem(key(order, "ORDER_CANCEL", "cancel_order")) is None
    h.open_recovery_window(age=0.6)
    replay = h.processor()
    again = [r for t in ("ORDER_CONFIRM", "ORDER_CANCEL") for r in await replay.run([ev(order, t)])]
    assert all(r.outcome is Outcome.APPLIED for r in again), again
    assert h.effects.sent["waybill", order] == 1 and h.effects.sent["sms", order] == 1
    assert len(h.effects.lookups) == 1 and h.order(order)["status"] == OrderStatus.CANCELLED
    assert h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms"))["status"] == IdemStatus.DONE


async def a_fresh_recovery_window_waits_for_a_request_still_on_its_way(h: Harness) -> None:
    """Right after a window opens, an SMS the store forgot may still be on its way to the
    gateway: a fresh claim neither asks nor sends until the settle has passed."""
    h.effects.verifiable = {"sms": 0.5}
    p = h.processor()
    [order] = await h.paid(p)
    backup = h.backup(order)
    [sent] = await p.run([ev(order, "ORDER_CANCEL")])
    assert sent.outcome is Outcome.APPLIED
    h.restore(backup)
    h.open_recovery_window()
    [early] = await p.run([ev(order, "ORDER_CANCEL")])
    assert isinstance(early.error, EffectOutcomeUnknown) and early.error.retriable and h.effects.lookups == []
    await h.pass_time(0.6)
    [later] = await p.run([ev(order, "ORDER_CANCEL")])
    assert later.outcome is Outcome.APPLIED, later
    assert h.effects.sent["sms", order] == 1 and len(h.effects.lookups) == 1


async def a_claim_to_be_looked_up_stays_so_when_its_call_is_not_made(h: Harness) -> None:
    """In a recovery window a fresh SMS claim is looked up before it is sent. When its call is
    not made (too little lease left), its row must not say "not delivered": the claim the store
    forgot may have sent the SMS under the same token. Once the window has ended, the next claim
    still asks, finds it, and sends nothing."""
    h.effects.verifiable = {"sms": 0.5}
    p = h.processor()
    [order] = await h.paid(p)
    backup = h.backup(order)
    [sent] = await p.run([ev(order, "ORDER_CANCEL")])
    assert sent.outcome is Outcome.APPLIED and h.effects.sent["sms", order] == 1
    h.restore(backup)                                                # the store forgot the claim that sent it
    h.open_recovery_window(age=0.6)
    [late] = await h.late_caller(p, "late/main/6").run([ev(order, "ORDER_CANCEL")])
    assert isinstance(late.error, ClaimExpiring) and h.effects.lookups == [], late
    assert h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms"))["outcome"] == "effect_outcome_unknown"
    h.end_recovery_window()
    await h.pass_time(1.6)                                           # the late claim's lease runs out
    [result] = await h.processor(owner="next/main/6").run([ev(order, "ORDER_CANCEL")])
    assert result.outcome is Outcome.APPLIED, result
    assert h.effects.sent["sms", order] == 1 and len(h.effects.lookups) == 1


async def a_claim_to_be_looked_up_stays_so_when_an_earlier_call_of_its_order_failed(h: Harness) -> None:
    """The same when the claim's call is skipped because the call before it in its order failed."""
    two_effects = Pipeline(LocalStep("mark_cancelled", OrderStatus.CANCELLED, sets={"cancel_reason": "reason"}),
                           effects=(EffectStep("recall_parcel", ISSUE_WAYBILL), EffectStep("send_cancel_sms", SEND_SMS)))
    with declared(EventType.CANCEL, two_effects):
        h.effects.verifiable = {"sms": 0.5}
        p = h.processor()
        [order] = await h.paid(p)
        backup = h.backup(order)
        [sent] = await p.run([ev(order, "ORDER_CANCEL")])
        assert sent.outcome is Outcome.APPLIED and h.effects.sent["sms", order] == 1
        h.restore(backup)
        h.open_recovery_window(age=0.6)
        h.effects.faults["waybill"].append(Fault(EffectUnavailable("503")))
        [failed] = await p.run([ev(order, "ORDER_CANCEL")])
        assert isinstance(failed.error, EffectUnavailable) and h.effects.lookups == [], failed
        assert h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms"))["outcome"] == "effect_outcome_unknown"
        h.end_recovery_window()
        await h.pass_time(0.6)
        [result] = await p.run([ev(order, "ORDER_CANCEL")])
        assert result.outcome is Outcome.APPLIED, result
        assert h.effects.sent["sms", order] == 1 and len(h.effects.lookups) == 1


async def a_pending_sms_a_restore_brought_back_is_looked_up_in_a_window(h: Harness) -> None:
    """The backup holds the SMS step pending and "not delivered" (the gateway refused it: 4xx);
    the run after the backup sent it. The restore brings the row back pending, so in a window the
    replay asks before it sends (not before the window is older than the settle), and finds it."""
    h.effects.verifiable = {"sms": 0.5}
    p = h.processor()
    [order] = await h.paid(p)
    h.effects.faults["sms"].append(Fault(EffectNotDelivered("429 refused")))
    [refused] = await p.run([ev(order, "ORDER_CANCEL")])
    assert isinstance(refused.error, EffectNotDelivered), refused
    assert h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms"))["outcome"] == "effect_not_delivered"
    backup = h.backup(order)
    [sent] = await p.run([ev(order, "ORDER_CANCEL")])
    assert sent.outcome is Outcome.APPLIED and h.effects.sent["sms", order] == 1
    h.restore(backup)                                                # pending, "not delivered", again
    h.open_recovery_window()
    [early] = await p.run([ev(order, "ORDER_CANCEL")])
    assert isinstance(early.error, EffectOutcomeUnknown) and h.effects.lookups == [], early
    await h.pass_time(0.6)
    [replay] = await p.run([ev(order, "ORDER_CANCEL")])
    assert replay.outcome is Outcome.APPLIED, replay
    assert h.effects.sent["sms", order] == 1 and len(h.effects.lookups) == 1
    assert h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms"))["status"] == IdemStatus.DONE


async def a_worker_whose_heartbeat_is_stale_claims_nothing(h: Harness) -> None:
    """A worker whose heartbeat has not got through for long enough that no call could start
    claims nothing: a claim it could not call under would cost the step an attempt, and a
    compensator retrying every second would spend them all (the attempt cap, a person)."""
    p = h.processor(owner="a/main/9", dead_after=3.0)
    h.beat(p)
    [order] = await h.paid(p)
    await h.pass_time(1.5)                   # 1.5 s + a call of 1 s reach the 2.5 s the fence allows
    for _ in range(3):
        try:
            await p.run([ev(order, "ORDER_CANCEL")])
        except StoreUnavailable as exc:
            assert "heartbeat" in str(exc), exc
        else:
            raise AssertionError("a worker whose heartbeat is stale claimed")
    assert h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms")) is None
    h.beat(p)
    [result] = await p.run([ev(order, "ORDER_CANCEL")])
    assert result.outcome is Outcome.APPLIED, result
    assert h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms"))["attempt"] == 1


async def a_dead_workers_claims_are_taken_over_at_its_death_not_at_their_leases_end(h: Harness) -> None:
    """A claims an SMS under a 30 s lease and dies before it calls; its heartbeat stops. While it
    may still be alive, B waits for it; once A is presumed dead (3 s after its last heartbeat) and
    the gateway has settled (0.5 s more), B asks and sends, once, long before the lease's end."""
    h.effects.verifiable = {"sms": 0.5}
    a = h.processor(owner="a/main/7", dead_after=3.0)
    b = h.processor(owner="b/main/7", dead_after=3.0)
    h.beat(a)
    h.beat(b)
    [order] = await h.paid(a)
    h.effects.crash = "before_send"
    try:
        await a.run([ev(order, "ORDER_CANCEL")])
        raise AssertionError("the worker should have died")
    except Crash:
        pass
    [early] = await b.run([ev(order, "ORDER_CANCEL")])
    assert isinstance(early.error, LeaseHeld), early
    await h.pass_time(3.7)
    h.beat(b)
    [result] = await b.run([ev(order, "ORDER_CANCEL")])
    assert result.outcome is Outcome.APPLIED, result
    assert h.effects.sent["sms", order] == 1 and len(h.effects.lookups) == 1
    assert h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms"))["attempt"] == 2


async def a_worker_taken_for_dead_never_calls_under_the_claims_it_held(h: Harness) -> None:
    """A claims an SMS, then its event loop is held up past its heartbeat's bound (a GC pause, a
    starved CPU): B takes A for dead, takes the claim over and sends. When A wakes and beats again,
    the claim it made before the gap is not its own to call any more: one SMS."""
    h.effects.verifiable = {"sms": 0.5}
    b = h.processor(owner="b/main/8", dead_after=3.0)
    resumed = asyncio.Event()
    harness = h

    class HeldUp(Processor):
        async def _t2(self, run, jobs):
            await resumed.wait()                 # B has taken the claim over and sent
            harness.beat(self)                   # A's heartbeats get through again
            return await super()._t2(run, jobs)

    a = HeldUp(h.store, h.effects, owner="a/main/8", tokens=StepTokens(b"scenarios"), clock=Clock(h.clock()),
               policy=ProcessorPolicy(lease_seconds=30, effect_concurrency=1, effect_timeout=1.0),
               safeguards=Safeguards(fence=SelfFence(3.0)))
    h.beat(a)
    h.beat(b)
    [order] = await h.paid(b)
    held = asyncio.create_task(a.run([ev(order, "ORDER_CANCEL")]))
    while h.idem(key(order, "ORDER_CANCEL", "send_cancel_sms")) is None:
        await asyncio.sleep(0.01)
    await h.pass_time(3.7)
    h.beat(b)
    [taken] = await b.run([ev(order, "ORDER_CANCEL")])
    assert taken.outcome is Outcome.APPLIED and h.effects.sent["sms", order] == 1, taken
    resumed.set()
    [late] = await held
    assert late.error is not None or late.outcome is Outcome.SUPERSEDED, late
    assert h.effects.sent["sms", order] == 1 and sum(c[0] == "sms" for c in h.effects.calls) == 1


async def a_waybill_whose_key_its_provider_forgot_is_not_called_again(h: Harness) -> None:
    """The logistics API keeps a key 1 s here. A call in doubt repeated inside that replays its waybill;
    past it, the same key would issue a second one: the step is left to a person, untouched."""
    h.effects.horizons = {"waybill": 1.0}
    p = h.processor()
    inside, past = await h.paid(p, 2)
    for order in (inside, past):
        h.effects.faults["waybill"].append(Fault(EffectUnavailable("reset after issuing"), after_work=True))
        [first] = await p.run([ev(order, "ORDER_CONFIRM")])
        assert isinstance(first.error, EffectUnavailable)
    [again] = await p.run([ev(inside, "ORDER_CONFIRM")])
    assert again.outcome is Outcome.APPLIED and h.effects.sent["waybill", inside] == 1
    await h.pass_time(1.2)
    h.effects.forget_keys()
    [late] = await p.run([ev(past, "ORDER_CONFIRM")])
    assert isinstance(late.error, KeyHorizonPassed) and not late.error.retriable, late
    assert h.effects.sent["waybill", past] == 1 and sum(c[:2] == ("waybill", past) for c in h.effects.calls) == 1
    row = h.idem(key(past, "ORDER_CONFIRM", "issue_waybill"))
    assert (row["status"], row["attempt"]) == (IdemStatus.PENDING, 1)      # nothing claimed: a person decides


async def a_key_horizon_counts_from_the_first_call_that_may_have_reached_the_provider(h: Harness) -> None:
    """A provider unreachable for longer than it keeps keys (no call reached it), then a call in doubt:
    the key is 0.1 s old to the provider, not the claim's 1.2 s, and the retry replays it as ever."""
    h.effects.horizons = {"waybill": 1.0}
    p = h.processor()
    [order] = await h.paid(p)
    h.effects.faults["waybill"].append(Fault(EffectNotDelivered("connection refused")))
    [refused] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert isinstance(refused.error, EffectNotDelivered)
    await h.pass_time(1.2)
    h.effects.faults["waybill"].append(Fault(EffectUnavailable("reset after issuing"), after_work=True))
    [doubt] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert isinstance(doubt.error, EffectUnavailable)
    [again] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert again.outcome is Outcome.APPLIED, again
    assert h.effects.sent["waybill", order] == 1


async def a_call_past_its_key_horizon_is_settled_by_its_lookup_or_left_to_a_person(h: Harness) -> None:
    """The SMS gateway's lookup answers for 1 s here. Past that, an SMS it finds is done; one it does
    not find is not sent (the gateway may have forgotten it): a person decides."""
    h.effects.verifiable = h.effects.askable = {"sms": 0.5}
    h.effects.horizons = {"sms": 1.0}
    p = h.processor()
    sent, unsure = await h.paid(p, 2)
    h.effects.faults["sms"].append(Fault(EffectOutcomeUnknown("reset after sending"), after_work=True))
    await p.run([ev(sent, "ORDER_CANCEL")])
    h.effects.faults["sms"].append(Fault(EffectOutcomeUnknown("503 before anything was done")))
    await p.run([ev(unsure, "ORDER_CANCEL")])
    await h.pass_time(1.2)
    [found] = await p.run([ev(sent, "ORDER_CANCEL")])
    assert found.outcome is Outcome.APPLIED and h.effects.sent["sms", sent] == 1
    [left] = await p.run([ev(unsure, "ORDER_CANCEL")])
    assert isinstance(left.error, KeyHorizonPassed) and "its lookup found nothing" in str(left.error), left
    assert h.effects.sent["sms", unsure] == 0 and len(h.effects.lookups) == 2
    row = h.idem(key(unsure, "ORDER_CANCEL", "send_cancel_sms"))
    assert (row["status"], row["outcome"]) == (IdemStatus.PENDING, "key_horizon_passed")


SCENARIOS = [a_stalled_owner_is_fenced_out_by_attempt, a_live_lease_is_not_taken,
             a_skipped_call_is_noted_and_made_on_the_retry, an_sms_with_an_unknown_outcome_is_never_sent_again,
             a_pending_waybill_of_a_cancelled_order_is_stale, a_payment_after_the_cancel_is_stale_but_recorded,
             a_claim_without_enough_lease_left_is_not_called,
             a_t3_run_twice_counts_its_own_rows_and_writes_one_receipt,
             a_replayed_batch_is_all_duplicates_and_a_new_payload_is_refused,
             the_ledger_keeps_one_row_per_record_and_flags_overtaken_letters,
             a_lost_sms_reply_is_looked_up_and_never_sent_again, an_sms_that_never_arrived_is_looked_up_and_sent_once,
             a_crash_between_the_lookup_and_the_send_is_looked_up_again,
             an_sms_sent_before_a_crash_stays_unknown_when_the_next_claim_is_not_called,
             a_lookup_that_took_the_lease_leaves_the_send_to_the_next_claim,
             an_order_older_than_the_retention_is_refused_and_leaves_no_trace,
             a_key_claimed_as_often_as_the_cap_is_left_to_a_person,
             a_restore_from_backup_asks_the_services_the_same_questions_again,
             a_fresh_recovery_window_waits_for_a_request_still_on_its_way,
             a_claim_to_be_looked_up_stays_so_when_its_call_is_not_made,
             a_claim_to_be_looked_up_stays_so_when_an_earlier_call_of_its_order_failed,
             a_pending_sms_a_restore_brought_back_is_looked_up_in_a_window,
             a_dead_workers_claims_are_taken_over_at_its_death_not_at_their_leases_end,
             a_worker_whose_heartbeat_is_stale_claims_nothing,
             a_worker_taken_for_dead_never_calls_under_the_claims_it_held,
             a_waybill_whose_key_its_provider_forgot_is_not_called_again,
             a_key_horizon_counts_from_the_first_call_that_may_have_reached_the_provider,
             a_call_past_its_key_horizon_is_settled_by_its_lookup_or_left_to_a_person]

