"""Random interleavings of claims, lease expiries, crashes and late finishers on ``t_idem``,
against MariaDB, checked step by step against a model of the rows.

The workers run the app's own transactions: T1 is ``Processor._t1`` (read under lock, decide,
claim, move the order), T3 is ``MySqlTransaction.finish_effects`` (fenced by owner and attempt).
They act on the waybill step of a few orders: claim it (T1 of the order's CONFIRM), finish a
claim they hold (T3: done, refused for good, not reachable, not delivered), stall past their
lease, restart under a new name, give their claims up (a dead-lettered record), and an order may
be cancelled under them. Lease expiry is SQL moving ``lease_until`` into the past: no sleeps.

A worker keeps every claim it ever made. So a worker that stalled wakes up and finishes an
attempt that is no longer its own (it must be fenced: nothing changes), and a finisher may run
its T3 twice (a lost commit: the second run finds its own rows and changes nothing).

The model (:class:`Model`) is the docs' state machine table written out by hand; it shares
no code with ``app.pipeline.plan`` or the SQL.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from hypothesis import event
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from app.adapters.mysql import MySqlStore, idem
from app.adapters.mysql.engine import create_engine
from app.pipeline.errors import EffectNotDelivered, EffectRejected, EffectUnavailable, LeaseHeld, PipelineError
from app.pipeline.model import EffectJob
from app.pipeline.outcomes import Outcome
from app.pipeline.ports import Finished, Receipt
from app.pipeline.processor import Processor, ProcessorPolicy
from app.pipeline.states import IdemStatus, OrderStatus
from app.pipeline.steps import Contract
from app.pipeline.tokens import StepTokens
from harness import sql_modes
from harness.events import order_no
from harness.pipeline import ev
from harness.services import connect

# Every database test here runs under the server's sql_mode and under MySQL 8's.
settings, scratch_db = sql_modes.each_sql_mode()

WORKERS = ("w1", "w2", "w3")
ORDERS = 2
LEASE = 30.0          # live until the test moves it into the past; an example takes well under this
PENDING, DONE, FAILED = IdemStatus.PENDING, IdemStatus.DONE, IdemStatus.FAILED
# How a T3 ends: the row's outcome it writes, and the status it moves a row of its own to.
ENDINGS = {"done": ("waybill_issued", DONE), "refused": ("effect_rejected", FAILED),
           "unavailable": ("effect_unavailable", PENDING), "not_delivered": ("effect_not_delivered", PENDING)}
# What T1 answers without writing anything: a live lease of another worker, a done or failed row.
WRITES_NOTHING = ("held", "duplicate", "refused")


class NoCalls:
    """T2 is played by the test: the processor never calls out here."""

    verifiable: dict[str, float] = {}
    askable: dict[str, float] = {}
    horizons: dict[str, float] = {}
    contracts = {"waybill": Contract.REPLAYS, "sms": Contract.LOOKUP}      # the shipped providers'

    async def call(self, job: EffectJob) -> Receipt:
        raise AssertionError("no call expected")

    lookup = call


@dataclass(frozen=True)
class Claim:
    """A claim a worker made and holds: what its T3 will be fenced on."""

    owner: str
    order: int
    job: EffectJob

    def __repr__(self) -> str:
        return f"Claim({self.owner}, order {self.order}, attempt {self.job.attempt})"


@dataclass
class Row:
    status: IdemStatus
    attempt: int
    owner: str
    token: str | None
    outcome: str | None
    live: bool                      # the lease still runs


@dataclass
class Model:
    """One order as the docs' tables say it must be."""

    status: OrderStatus = OrderStatus.PAID
    confirm: str | None = None      # outcome of the CONFIRM's local step (mark_confirmed), once it ran
    row: Row | None = None          # the waybill step's t_idem row
    receipt: tuple[int, str] | None = None    # (attempt, token) of the one waybill receipt
    earlier_unknown: bool = False   # the current attempt's predecessor may have reached the API

    def claim(self, owner: str) -> str:
        """T1 of the CONFIRM by ``owner``: what it must answer, and the row it must leave."""
        if self.confirm is None:
            self.confirm = "stale" if self.status is OrderStatus.CANCELLED else "applied"
            if self.confirm == "stale":
                return "stale"
            self.status = OrderStatus.CONFIRMED
        if self.confirm == "stale":
            return "duplicate"
        row = self.row
        if row is None:
            self.row = Row(PENDING, 1, owner, None, None, live=True)      # the token is the job's
            self.earlier_unknown = False
            return "claimed"
        if row.status is DONE or (row.status is FAILED and row.outcome == "stale"):
            return "duplicate"
        if row.status is FAILED:
            return "refused"
        if row.live and row.owner != owner:
            return "held"
        if self.status is OrderStatus.CANCELLED:          # past the waybill's target: never called
            # ... and if its last attempt may have reached the API, a person is told.
            reported = row.outcome != "effect_not_delivered"
            row.status, row.outcome, row.live = FAILED, "stale", False
            return "stale, for a person" if reported else "stale"
        self.earlier_unknown = row.outcome != "effect_not_delivered"
        row.attempt, row.owner, row.outcome, row.live = row.attempt + 1, owner, None, True
        return "claimed"

    def finish(self, owner: str, attempt: int, ending: str) -> bool:
        """T3 of ``owner``'s claim at ``attempt``: True if the row is (now) its own to have ended so."""
        outcome, status = ENDINGS[ending]
        if ending == "not_delivered" and self.earlier_unknown:
            outcome = "effect_outcome_unknown"      # not called now, but maybe by the attempt before
        row = self.row
        ours = row is not None and row.owner == owner and row.attempt == attempt
        if not ours:
            return False
        if row.status is PENDING:
            row.status, row.outcome = status, outcome
            if status is not PENDING:
                row.live = False
                if status is DONE:
                    self.receipt = (attempt, row.token)
            return True
        # A second run of a T3 whose rows already moved: its own only if it moved them the same way.
        return status is not PENDING and row.status is status and row.outcome == outcome


class IdemMachine(RuleBasedStateMachine):
    """Three workers, two orders, one t_idem: the database and the model in lockstep.
    Order 0 is never cancelled, so its waybill lives its whole life; order 1 may be."""

    loop: asyncio.AbstractEventLoop
    store: MySqlStore
    db_url: str

    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.db = connect(self.db_url)
        self.query("SET time_zone = '+00:00'")             # the app's sessions write leases in UTC
        self.names = {w: f"{w}#1" for w in WORKERS}        # a worker's name changes when it restarts
        self.models = [Model() for _ in range(ORDERS)]
        self.orders: list[str] = []
        self.seen: dict[str, dict] = {}                   # each row as last read: the history check
        self.ended_by: dict[str, tuple[str, int]] = {}    # key -> the (owner, attempt) whose T3 ended it

    def teardown(self) -> None:
        self.db.close()

    @initialize()
    def paid_orders(self) -> None:
        self.orders = [order_no(prefix="IDP") for _ in range(ORDERS)]
        self.keys = [f"{o}:ORDER_CONFIRM:issue_waybill" for o in self.orders]
        results = self.run(self.processor("setup#1").run(
            [ev(o, t) for o in self.orders for t in ("ORDER_CREATED", "ORDER_PAID")]))
        assert all(r.outcome is Outcome.APPLIED for r in results), results
        self.confirms = [ev(o, "ORDER_CONFIRM") for o in self.orders]
        self.cancel_last = ev(self.orders[-1], "ORDER_CANCEL")

    # -- the rules --------------------------------------------------------------------------

    @rule(target=claims, worker=st.sampled_from(WORKERS), order=st.integers(0, ORDERS - 1))
    def claim(self, worker: str, order: int):
        owner, model = self.names[worker], self.models[order]
        expected = model.claim(owner)
        before = self.snapshot() if expected in WRITES_NOTHING else None
        p = self.processor(owner)
        plan = self.run(self.store.in_transaction(lambda tx: p._t1(tx, [self.confirms[order]]))).events[0]
        found = found_by(plan)
        event(f"T1 {found}")
        assert found == expected, f"T1 of {owner} answered {found}, the model says {expected}: {plan}"
        if before is not None:      # a live lease, a done or failed row: T1 writes nothing at all
            assert self.snapshot() == before, f"T1 of {owner} ({found}) wrote something"
        if expected != "claimed":
            return multiple()
        [job] = plan.jobs
        row = model.row
        row.token = row.token or job.token                 # persisted on the first claim, sent on every one
        assert (job.attempt, job.token) == (row.attempt, row.token), \
            f"the claim carries attempt {job.attempt}, token {job.token}; the row {row.attempt}, {row.token}"
        return Claim(owner, order, job)

    @rule(claim=claims, ending=st.sampled_from(sorted(ENDINGS)))
    def finish(self, claim: Claim, ending: str) -> None:
        """T3 of a claim, whenever: current, taken over since, or already finished."""
        model = self.models[claim.order]
        taken_over = model.row.attempt > claim.job.attempt
        ours = model.finish(claim.owner, claim.job.attempt, ending)
        before = None if ours else self.snapshot()
        owned = self.run(self.store.in_transaction(
            lambda tx: tx.finish_effects([finished(claim.job, ending)], owner=claim.owner)))
        event(f"T3 {ending}: {'own' if ours else 'fenced, taken over' if taken_over else 'fenced'}")
        assert owned == ({claim.job.biz_key} if ours else set()), f"T3 of {claim} ({ending}) owned {owned}"
        if before is not None:
            assert self.snapshot() == before, f"a fenced T3 of {claim} ({ending}) changed something"
        if owned and ENDINGS[ending][1] is not PENDING:   # one claim, and only one, ends a key
            first = self.ended_by.setdefault(claim.job.biz_key, (claim.owner, claim.job.attempt))
            assert first == (claim.owner, claim.job.attempt), f"{claim} ended a key {first} had ended"

    def live_leases(self) -> bool:
        return any(m.row is not None and m.row.live for m in self.models)

    @precondition(live_leases)
    @rule(order=st.integers(0, ORDERS - 1))
    def lease_runs_out(self, order: int) -> None:
        self.expire([order])

    @precondition(live_leases)
    @rule(worker=st.sampled_from(WORKERS), restart=st.booleans())
    def crash(self, worker: str, restart: bool) -> None:
        """The worker stops (kill -9, SIGSTOP, a long pause) and its leases run out. Stalled, it keeps
        its name and may wake up and finish its claims; restarted, it claims under a new name (and
        its old claims, should they still be finished, are fenced like any other stale ones)."""
        owner = self.names[worker]
        self.expire(range(ORDERS), owner=owner)
        if restart:
            name, incarnation = owner.split("#")
            self.names[worker] = f"{name}#{int(incarnation) + 1}"

    @precondition(live_leases)
    @rule(worker=st.sampled_from(WORKERS))
    def give_up(self, worker: str) -> None:
        """The worker dead-letters its records and releases their claims (``idem.release``)."""
        owner = self.names[worker]
        for model in self.models:
            if model.row is not None and model.row.status is PENDING and model.row.owner == owner:
                model.row.live = False
        self.run(self.store.in_transaction(lambda tx: idem.release(tx._exec, self.keys, owner=owner)))

    @precondition(lambda self: self.orders and self.models[-1].status is not OrderStatus.CANCELLED)
    @rule()
    def cancel(self) -> None:
        p = self.processor("canceller#1")
        plan = self.run(self.store.in_transaction(lambda tx: p._t1(tx, [self.cancel_last]))).events[0]
        assert plan.error is None and [j.step for j in plan.jobs] == ["send_cancel_sms"], plan
        self.models[-1].status = OrderStatus.CANCELLED

    # -- what must hold after every step ----------------------------------------------------

    @invariant()
    def rows_are_as_the_model_says_and_never_go_back(self) -> None:
        if not self.orders:
            return
        rows = {r["biz_key"]: r for r in self.query(
            "SELECT *, lease_until > NOW(3) AS live FROM t_idem WHERE biz_key IN %s", self.keys)}
        receipts = {r["order_no"]: r for r in self.query(
            "SELECT * FROM t_waybill_receipt WHERE order_no IN %s", self.orders)}
        statuses = {r["order_no"]: r["status"] for r in self.query(
            "SELECT order_no, status FROM t_order WHERE order_no IN %s", self.orders)}
        for i, (order, key, model) in enumerate(zip(self.orders, self.keys, self.models)):
            assert statuses[order] == model.status, f"order {i}"
            found, m = rows.get(key), model.row
            if m is None:
                assert found is None, f"order {i}: a waybill row the model has not: {found}"
            else:
                assert found is not None, f"order {i}: no waybill row, the model has {m}"
                assert (found["status"], found["attempt"], found["owner"], found["idem_token"], found["outcome"],
                        bool(found["live"])) == (m.status, m.attempt, m.owner, m.token, m.outcome, m.live), \
                    f"order {i}: {found} but the model has {m}"
            receipt = receipts.get(order)
            assert (None if receipt is None else (receipt["attempt"], receipt["idem_token"])) == model.receipt, \
                f"order {i}: receipt {receipt}, the model has {model.receipt}"
            self.never_goes_back(found, receipt)

    def never_goes_back(self, row: dict | None, receipt: dict | None) -> None:
        """Without the model: a terminal row never changes again (not even its timestamps), the
        attempt never decreases, the token a row was first written with is the one it keeps,
        and a receipt is the done row's, of its attempt and token."""
        if receipt is not None:
            assert row is not None and (row["status"], row["attempt"], row["idem_token"]) == \
                (DONE, receipt["attempt"], receipt["idem_token"]), f"receipt {receipt} of row {row}"
        if row is None:
            return
        old = self.seen.get(row["biz_key"])
        self.seen[row["biz_key"]] = row
        if old is None:
            return
        if old["status"] in (DONE, FAILED):
            assert row == old, f"a terminal row changed: {old} -> {row}"
        assert row["attempt"] >= old["attempt"], f"attempt went down: {old} -> {row}"
        assert row["idem_token"] == old["idem_token"], f"the token changed: {old} -> {row}"

    # -- the app's transactions and the database ---------------------------------------------

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def processor(self, owner: str) -> Processor:
        return Processor(self.store, NoCalls(), owner=owner, tokens=StepTokens(b"properties"),
                         policy=ProcessorPolicy(lease_seconds=LEASE, effect_concurrency=1))

    def expire(self, orders, owner: str | None = None) -> None:
        """Move the leases of ``orders``' pending rows (``owner``'s only, if given) into the past."""
        for i in orders:
            row = self.models[i].row
            if row is not None and row.status is PENDING and owner in (None, row.owner):
                row.live = False
        self.query("UPDATE t_idem SET lease_until = NOW(3) - INTERVAL 1 SECOND WHERE biz_key IN %s "
                   "AND status = 1 AND lease_until IS NOT NULL AND owner = COALESCE(%s, owner)",
                   [self.keys[i] for i in orders], owner)

    def query(self, sql: str, *args) -> list[dict]:
        with self.db.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def snapshot(self) -> tuple:
        """Everything this example wrote, column for column."""
        mine = " OR ".join(["biz_key LIKE %s"] * len(self.orders))
        return (self.query(f"SELECT * FROM t_idem WHERE {mine} ORDER BY biz_key", *(f"{o}:%" for o in self.orders)),
                self.query("SELECT * FROM t_order WHERE order_no IN %s ORDER BY order_no", self.orders),
                self.query("SELECT * FROM t_waybill_receipt WHERE order_no IN %s ORDER BY order_no", self.orders))


def found_by(plan) -> str:
    """What T1 answered for the CONFIRM, in the model's words."""
    if plan.jobs:
        return "claimed"
    if isinstance(plan.error, LeaseHeld):
        return "held"
    if isinstance(plan.error, PipelineError) and plan.error.reason == "effect_rejected":
        return "refused"
    if isinstance(plan.error, PipelineError) and plan.error.reason == "stale_effect_may_exist":
        return "stale, for a person"
    if plan.outcome is not None and plan.error is None:
        return {Outcome.DUPLICATE: "duplicate", Outcome.STALE: "stale"}.get(plan.outcome, str(plan.outcome))
    return f"unexpected: {plan}"


def finished(job: EffectJob, ending: str) -> Finished:
    if ending == "done":
        return Finished(job, receipt=Receipt(reference=f"WB-{job.attempt}-{job.token[:8]}"))
    error = {"refused": EffectRejected("422: address refused"), "unavailable": EffectUnavailable("503"),
             "not_delivered": EffectNotDelivered("not called")}[ending]
    return Finished(job, error=error)


def test_t_idem_holds_its_rules_through_random_claims_expiries_crashes_and_late_finishers(settings, scratch_db):
    loop = asyncio.new_event_loop()
    engine = create_engine(settings, url=scratch_db.url)
    # No re-runs: one step at a time never meets a lock, and a refused fenced write must show, not retry.
    machine = type("IdemMachine", (IdemMachine,), {
        "loop": loop, "store": MySqlStore(engine, lock_retries=0), "db_url": scratch_db.url})
    try:
        run_state_machine_as_test(machine, settings=hsettings(
            max_examples=150, stateful_step_count=40, deadline=None, derandomize=True, database=None))
    finally:
        loop.run_until_complete(engine.dispose())
        loop.close()


def test_the_model_fences_a_stalled_claim():
    """The model alone, the way the docs' table reads: a claim taken over after a stall."""
    model = Model()
    assert model.claim("a#1") == "claimed" and model.row.attempt == 1
    model.row.live = False                                         # a stalls past its lease
    assert model.claim("b#1") == "claimed" and model.row.attempt == 2
    assert model.finish("a#1", 1, "done") is False                 # a wakes up: fenced
    assert model.finish("b#1", 2, "done") is True and model.finish("b#1", 2, "done") is True
    assert replace(model.row, token=None) == Row(DONE, 2, "b#1", None, "waybill_issued", False)
    assert model.claim("c#1") == "duplicate"
