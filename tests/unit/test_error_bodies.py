"""A service's answer or a record's bytes in a stored message: the text itself, so people read it
and masking finds what is in it (``app.pipeline.excerpts``), never Python's ``repr`` of bytes."""

from __future__ import annotations

import asyncio
from datetime import date

import pytest

from app.adapters.effects.sms import SmsClient
from app.adapters.effects.waybill import WaybillClient
from app.pipeline.errors import EffectNotDelivered, EffectRejected, MalformedEvent
from app.pipeline.events import check_headers, decode
from app.pipeline.excerpts import excerpt
from app.pipeline.model import EffectJob
from app.pipeline.states import OrderStatus
from app.pipeline.steps import ISSUE_WAYBILL, SEND_SMS

ADDRESS = "北京市朝阳区建国路88号"
TOKEN = "0123456789abcdef0123456789abcdef"


def test_utf8_is_written_as_its_text():
    assert excerpt(f'{{"error": "no delivery to {ADDRESS}"}}'.encode()) == f'{{"error": "no delivery to {ADDRESS}"}}'


@pytest.mark.parametrize("limit, shown", [(300, "北" * 100 + "…"), (301, "北" * 100 + "…"), (302, "北" * 100 + "…"),
                                          (303, "北" * 101 + "…"), (600, "北" * 200)])
def test_a_long_body_is_cut_on_a_character_boundary(limit, shown):
    assert excerpt(("北" * 200).encode(), limit) == shown


def test_bytes_that_are_not_utf8_stay_visible_and_control_characters_are_escaped():
    assert excerpt(b"\xff\xfebad") == "\\xff\\xfebad"
    assert excerpt("a\nb\tc\x1b[31md\u202ee\u200bf\x7f".encode()) == "a\\nb\\tc\\x1b[31md\\u202ee\\u200bf\\x7f"
    assert excerpt(b"") == "" and excerpt("Straße") == "Straße"


class Answer:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body

    async def __aenter__(self) -> Answer:
        return self

    async def __aexit__(self, *exc) -> None:
        return None

    async def read(self) -> bytes:
        return self.body


class Session:
    """Answers every request with one status and body, as an echoing service does."""

    def __init__(self, status: int, body: bytes) -> None:
        self.answer = Answer(status, body)

    def post(self, url: str, **kwargs) -> Answer:
        return self.answer


def job(effect) -> EffectJob:
    return EffectJob(0, "ORD-20261129-A1", "ORD-20261129-A1:ORDER_CONFIRM:issue_waybill", date(2026, 11, 29),
                     "issue_waybill", effect, TOKEN, 1, {"address": ADDRESS}, OrderStatus.CONFIRMED)


@pytest.mark.parametrize("client, effect, error", [
    (WaybillClient, ISSUE_WAYBILL, EffectRejected), (SmsClient, SEND_SMS, EffectNotDelivered)])
def test_a_refusal_keeps_the_services_body_as_text(client, effect, error):
    body = f'{{"error": "undeliverable", "address": "{ADDRESS}"}}'.encode()
    made = client(Session(422, body), base_url="http://service", timeout_seconds=1)
    with pytest.raises(error) as raised:
        asyncio.run(made.call(job(effect)))
    assert str(raised.value).endswith(f'refused with 422: {{"error": "undeliverable", "address": "{ADDRESS}"}}')
    assert "b'" not in str(raised.value) and "\\x" not in str(raised.value)


def test_a_record_key_and_a_header_key_are_written_as_text():
    value = (b'{"event_id": "e1", "order_no": "ORD-20261129-A1", "type": "ORDER_CONFIRM", '
             b'"occurred_at": "2026-11-29T10:00:00+08:00", "data": {}}')
    with pytest.raises(MalformedEvent) as raised:
        decode(f"ORD-20261129-A1 {ADDRESS}\n".encode(), value, max_bytes=10_000)
    assert f'record key "ORD-20261129-A1 {ADDRESS}\\n" differs' in str(raised.value)
    with pytest.raises(MalformedEvent) as raised:
        check_headers([(b"\xff\xfebad".decode("utf-8", "surrogateescape"), b"1")])
    assert str(raised.value) == 'header key "\\xff\\xfebad" is not UTF-8'
