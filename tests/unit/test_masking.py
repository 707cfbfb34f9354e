"""What a viewer sees of phone numbers and addresses (``app.masking``): the documented shapes,
in fields, in free text, in records that are JSON, and none of a record that is not."""

from __future__ import annotations

import json

import pytest

from app.masking import WITHHELD_BYTES, mask_address, mask_answer, mask_letter, mask_phone, mask_text

PHONE, ADDRESS = "+8613800001234", "88 Hidden Lane, Flat 4"


@pytest.mark.parametrize("phone, shown", [
    ("+8613800001234", "***1234"), ("138 0000 1234", "***1234"), ("(010) 8888-1234", "***1234"),
    ("+1-202-555-0143", "***0143"), ("12345678", "***5678"), ("1234567", "***"), ("12", "***"), ("", "***")])
def test_a_phone_keeps_its_last_four_digits_and_a_short_one_nothing(phone, shown):
    assert mask_phone(phone) == shown


@pytest.mark.parametrize("address, shown", [
    (ADDRESS, "88 ***"), ("1 Test Road", "1 T***"), ("  1 Test Road  ", "1 T***"), ("Flat 4", "***"), ("", "***")])
def test_an_address_keeps_its_first_three_characters_and_a_short_one_nothing(address, shown):
    assert mask_address(address) == shown


def test_phone_numbers_in_free_text_are_masked_and_order_numbers_dates_and_small_numbers_are_not():
    text = ("sms to +86 138-0000-1234 refused for ORD-20261129-CONS0000001ab at 2026-11-29T10:00:00+08:00 "
            "(day 2026-12-01, attempt 3, status 500)")
    assert mask_text(text) == ("sms to ***1234 refused for ORD-20261129-CONS0000001ab at 2026-11-29T10:00:00+08:00 "
                               "(day 2026-12-01, attempt 3, status 500)")


def test_a_known_phone_or_address_is_replaced_wherever_it_appears_in_the_same_answer():
    answer = {"order": {"phone": PHONE, "address": ADDRESS, "order_no": "ORD-20261129-A1"},
              "history": [{"note": f"customer at {ADDRESS} called", "actor": "web:alice"}],
              "steps": [{"last_err": f"gateway refused {PHONE}", "biz_key": "ORD-20261129-A1:ORDER_CREATED:send_sms"}]}
    masked = json.dumps(mask_answer(answer))
    assert PHONE not in masked and ADDRESS not in masked and "13800001234" not in masked
    assert "customer at 88 *** called" in masked and "gateway refused ***1234" in masked
    assert "ORD-20261129-A1:ORDER_CREATED:send_sms" in masked and "web:alice" in masked


def detail(value: bytes, *, truncated: bool = False) -> dict:
    return {"id": 7, "truncated": truncated, "order_no": "ORD-20261129-A1", "message": "boom",
            "record": {"key": {"text": "ORD-20261129-A1", "bytes": 15}, "value": {"text": value.decode("utf-8", "replace"),
                       "bytes": len(value)}, "headers": [{"key": "trace", "value": {"text": f"from {PHONE}"}}]},
            "order": None, "idem": [], "history": []}


def test_a_json_record_is_masked_field_by_field_at_any_depth():
    doc = {"event_id": "12345678-1234-5678-1234-567812345678", "order_no": "ORD-20261129-A1", "type": "ORDER_CREATED",
           "occurred_at": "2026-11-29T10:00:00+08:00",
           "data": {"amount_cents": 100, "phone": PHONE, "address": ADDRESS,
                    "contact": {"mobile": "13912345678", "home_address": "77 Secret Street", "note": "ring 139 5555 6666"},
                    "alternates": [{"phone": "+442071234567"}, {"phone": 8613700005678}]}}
    value = json.dumps(doc).encode()
    masked = mask_letter(detail(value), value)
    text = json.dumps(masked)
    for secret in (PHONE, ADDRESS, "13912345678", "77 Secret Street", "139 5555 6666", "+442071234567",
                   "8613700005678"):
        assert secret not in text, secret
    shown = json.loads(masked["record"]["value"]["text"])
    assert shown["data"]["phone"] == "***1234" and shown["data"]["address"] == "88 ***"
    assert shown["data"]["contact"] == {"mobile": "***5678", "home_address": "77 ***", "note": "ring ***6666"}
    assert shown["data"]["alternates"] == [{"phone": "***4567"}, {"phone": "***5678"}]
    assert shown["event_id"] == doc["event_id"] and shown["occurred_at"] == doc["occurred_at"]     # identifiers whole
    assert masked["record"]["headers"][0]["value"]["text"] == "from ***1234"
    assert masked["masked"] and masked["record"]["value"]["masked"]


@pytest.mark.parametrize("value", [
    f"phone={PHONE};address={ADDRESS}".encode(),                         # not JSON
    b"\xff\xfe" + ADDRESS.encode(),                                       # not UTF-8
    json.dumps({"data": {"phone": PHONE, "address": ADDRESS}}).encode()[:-3],   # cut short
], ids=["not-json", "not-utf8", "cut-short"])
def test_a_record_that_is_not_json_is_withheld_whole(value):
    masked = mask_letter(detail(value), value)
    assert "withheld" in masked["record"]["value"] and masked["record"]["value"]["bytes"] == len(value)
    assert "text" not in masked["record"]["value"] and ADDRESS not in json.dumps(masked)


def test_a_truncated_record_is_withheld_even_when_its_start_parses():
    value = json.dumps({"data": {"address": ADDRESS}}).encode()
    masked = mask_letter(detail(value, truncated=True), value)
    assert "carries only the start" in masked["record"]["value"]["withheld"]
    assert ADDRESS not in json.dumps(masked) and "88 Hidden" not in json.dumps(masked)


def test_bytes_that_are_not_text_are_withheld_from_a_viewer():
    answer = {"record": {"key": {"base64": "Kzg2MTM4MDAwMDEyMzQ=", "bytes": 14}}}
    assert mask_answer(answer)["record"]["key"]["base64"] == WITHHELD_BYTES


def test_what_is_not_a_string_passes_unchanged():
    answer = {"id": 13800001234, "retriable": True, "attempts": None, "amount_cents": 1_290_000_000}
    assert mask_answer(answer) == {**answer, "masked": True}
