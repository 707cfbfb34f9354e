"""Idempotency tokens are a function of the step and the deployment's secret: the same step
asks the services the same question whatever the store forgot."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from app.pipeline.events import decode
from app.pipeline.model import IdemRow
from app.pipeline.plan import plan_batch, step_keys
from app.pipeline.states import IdemStatus
from app.pipeline.steps import Contract
from app.pipeline.tokens import TOKEN_CHARS, StepTokens
from app.settings import Settings, SettingsError
from harness.events import event, record
from harness.services import ROOT


def ev(order_no: str, type_: str):
    return decode(*record(event(order_no, type_)), max_bytes=1 << 20)


def test_a_step_always_gets_the_same_token_under_one_secret():
    tokens = StepTokens(b"production")
    key = "ORD-20261201-A1:ORDER_CONFIRM:issue_waybill"
    assert tokens(key) == StepTokens(b"production")(key)
    assert len(tokens(key)) == TOKEN_CHARS and int(tokens(key), 16) >= 0
    assert tokens(key) != tokens("ORD-20261201-A2:ORDER_CONFIRM:issue_waybill")


def test_two_deployments_never_share_a_token():
    key = "ORD-20261201-A1:ORDER_CANCEL:send_cancel_sms"
    assert StepTokens(b"staging")(key) != StepTokens(b"production")(key)


def test_the_secret_is_never_shown_and_never_empty():
    assert "production" not in repr(StepTokens(b"production"))
    with pytest.raises(ValueError):
        StepTokens(b"")


def test_a_claim_forgotten_by_the_store_is_claimed_again_with_the_same_token():
    tokens = StepTokens(b"production")
    events = [ev("ORD-20261201-T1", t) for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
    first = plan_batch(events, {}, {}, owner="a/main/1", tokens=tokens)
    # The store lost every row (a restore from backup): the replay plans from nothing again.
    again = plan_batch(events, {}, {}, owner="b/main/2", tokens=tokens)
    [job] = first.events[2].jobs
    [replayed] = again.events[2].jobs
    assert job.token == replayed.token == tokens(step_keys(events[2])[1])


def test_a_row_keeps_the_token_it_was_claimed_with():
    tokens = StepTokens(b"production")
    events = [ev("ORD-20261201-T2", t) for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
    first = plan_batch(events, {}, {}, owner="a/main/1", tokens=tokens)
    rows = {row.biz_key: IdemRow(row.biz_key, row.status, 1, "a/main/1",
                                 "a-random-token-of-before" if row.status is IdemStatus.PENDING else row.idem_token,
                                 row.payload_hash, row.outcome, None, expired=True, remaining=0.0)
            for row in first.inserts}
    again = plan_batch(events, rows, dict(first.orders), owner="b/main/2", tokens=tokens,
                       contracts={"waybill": Contract.REPLAYS})
    [job] = again.events[2].jobs
    assert job.token == "a-random-token-of-before" and job.attempt == 2


def test_settings_without_a_secret_say_how_to_make_one_and_show_no_value():
    with pytest.raises(SettingsError, match="IDEM_TOKEN_SECRET is not set"):
        StepTokens(Settings(idem_token_secret=None).effects.token_key())
    with pytest.raises(SettingsError):
        StepTokens(Settings(idem_token_secret="   ").effects.token_key())      # spaces are no secret


def test_a_worker_without_a_secret_does_not_start():
    env = {k: v for k, v in os.environ.items() if k != "IDEM_TOKEN_SECRET"}
    done = subprocess.run([sys.executable, "-c", "import app.main"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 78, done.stderr
    assert "IDEM_TOKEN_SECRET is not set" in done.stderr and "Traceback" not in done.stderr
