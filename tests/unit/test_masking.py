"""What a viewer sees of phone numbers and addresses (``app.personal.masking``): the documented shapes,
in fields, in free text, in records that are JSON, and none of a record that is not."""

from __future__ import annotations

import json
import quopri
import re
import uuid
from urllib.parse import quote, quote_plus

import pytest

from app.personal.masking import (
    WITHHELD_BYTES,
    mask_address,
    mask_answer,
    mask_letter,
    mask_phone,
    mask_text,
    order_numbers,
)

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


# -- by pattern, in any encoding ----------------------------------------------------------

ZH_PHONE, ZH_ADDRESS = "+8613912345678", "北京市朝阳区建国路88号华贸中心3座1203室"
CONTACTS = [{"phone": ZH_PHONE, "address": ZH_ADDRESS}]       # the order's own, read from t_order
TOKEN = "5f0c3e9a7d214b6c8e1f2a3b4c5d6e7f"
ENCODINGS = {
    "plain": lambda s: s,
    "repr of bytes": lambda s: repr(s.encode("utf-8"))[2:-1],
    "repr of text (ascii)": lambda s: ascii(s)[1:-1],
    "JSON escapes": lambda s: json.dumps(s)[1:-1],
    "JSON escapes, upper case": lambda s: re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m.group(1).upper(),
                                                 json.dumps(s)[1:-1]),
    "escaped twice": lambda s: json.dumps(json.dumps(s))[1:-1],
    "percent-encoded": lambda s: quote(s),
    "percent-encoded, lower case": lambda s: quote(s).lower(),
    "form-encoded": lambda s: quote_plus(s),
    "HTML entities": lambda s: "".join(c if c.isascii() else f"&#{ord(c)};" for c in s),
    "HTML hex entities": lambda s: "".join(c if c.isascii() else f"&#x{ord(c):x};" for c in s),
    "quoted-printable": lambda s: quopri.encodestring(s.encode()).decode().replace("=\n", ""),
    "full-width digits": lambda s: s.translate({ord(d): chr(0xFF10 + int(d)) for d in "0123456789"}),
    "zero-width spaces": lambda s: "\u200b".join(s),
}


def secrets_in(text: str) -> list[str]:
    """Which of the order's own values ``text`` still holds, in any of ``ENCODINGS``."""
    return [f"{name} of {secret}" for secret in (ZH_PHONE, ZH_ADDRESS, ZH_ADDRESS[:11], ZH_PHONE[3:], TOKEN)
            for name, encode in ENCODINGS.items() if encode(secret) in text]


@pytest.mark.parametrize("encoding", ENCODINGS, ids=list(ENCODINGS))
def test_the_orders_own_phone_and_address_are_found_in_any_encoding_in_an_answer_without_the_order(encoding):
    encode = ENCODINGS[encoding]
    message = f"logistics for ORD-20261129-A1: refused with 422: deliver to {encode(ZH_ADDRESS)}, call {encode(ZH_PHONE)}"
    answer = {"biz_key": "ORD-20261129-A1:ORDER_CONFIRM:issue_waybill", "last_err": message}
    masked = mask_answer(answer, CONTACTS)
    assert secrets_in(json.dumps(masked, ensure_ascii=False)) == [], masked["last_err"]
    assert "北京市***" in masked["last_err"] and "***5678" in masked["last_err"]
    assert masked["last_err"].startswith("logistics for ORD-20261129-A1: refused with 422: deliver to ")


def test_a_part_of_the_orders_address_is_found_alone():
    masked = mask_answer({"note": "courier says 华贸中心3座1203室 is closed"}, CONTACTS)["note"]
    assert masked == "courier says 华贸中*** is closed"


@pytest.mark.parametrize("encoding", ["plain", "repr of bytes", "JSON escapes", "percent-encoded", "HTML entities"])
def test_the_orders_address_cut_short_at_the_end_of_a_text_is_masked_as_far_as_it_goes(encoding):
    encoded = ENCODINGS[encoding](ZH_ADDRESS)
    for cut in range(1, len(encoded)):
        for end in ("", "…"):                    # a column's limit, an excerpt's
            masked = mask_answer({"message": f"refused with 422: {encoded[:cut]}{end}"}, CONTACTS)["message"]
            assert ENCODINGS[encoding](ZH_ADDRESS[:5]) not in masked, (cut, masked)


@pytest.mark.parametrize("text, shown", [
    ("write to jane.doe@example.com today", "write to j***@*** today"),
    ("13800138000@163.com", "1***@***"),
    ("JANE+orders@Mail.Example.CO.UK;", "J***@***;"),
    ("jane (at) example.org", "j***@***"),
    ("客服邮箱：zhang.san@例子.公司", "客服邮箱：z***@***"),
])
def test_an_email_address_keeps_its_first_character(text, shown):
    assert mask_text(text) == shown


@pytest.mark.parametrize("text, shown", [
    ("call me back on 13800138000", "call me back on ***8000"),
    ("手机13800138000找我", "手机***8000找我"),                   # glued to Chinese
    ("tel13800138000", "tel***8000"),                            # a mainland mobile, glued to letters
    ("tel:+86 138 0013 8000", "tel:***8000"),
    ("phone+8613800138000.", "phone***8000."),                   # + and 8 or more digits, glued to anything
    ("card 6222 0212 3456 7890 expired", "card ***7890 expired"),
    ("ID 11010519491231002X on file", "ID ***1002 on file"),
    ("extension 1234567", "extension ***"),                      # 7 digits: a long number, under 8 shows nothing
])
def test_phone_numbers_and_long_numbers_are_masked_wherever_they_stand(text, shown):
    assert mask_text(text) == shown


@pytest.mark.parametrize("text, shown", [
    ("call me back on 13800138000 at 12 Main Street", "call me back on ***8000 at 12 ***"),
    ("88 Hidden Lane, Flat 4 please", "88 *** please"),
    ("221B Baker St. is closed", "221*** is closed"),
    ("deliver to 7 oak tree road instead", "deliver to 7 o*** instead"),
    ("收货地址：北京市朝阳区建国路88号华贸中心3座1203室，谢谢", "收货地址：北京市***，谢谢"),
    ("送到上海市浦东新区", "送到上***"),
    ("客户在建国路八十八号等", "客户在***"),
])
def test_street_addresses_are_found_by_their_shape(text, shown):
    assert mask_text(text) == shown


@pytest.mark.parametrize("text", [
    "logistics for ORD-20261129-CONS0000001ab: answered 503",
    "gave up after 5 redrives: effect_unavailable: SMS for ORD-20261201-Q1: no answer within 2.5s; it may have been sent",
    "at 2026-11-29T10:00:00+08:00 (day 2026-12-01, attempt 3 of 5, status 500, 2026-11-29 10:00:00.123)",
    "event 3f2a9c1e-1111-2222-3333-444455556666 at offset 99381 of order-event[3]@1234",
    "ClientConnectorError: Cannot connect to host 192.168.100.200:8080 ssl:default",
    "payload sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, group 3f9c0a6d1e2b4c58",
    "waybill WB0000000001 issued, SMS0000000001 accepted",
    "the order went 2 ways, 3 roads and 4 places",
    "地址无效，请联系客服",
])
def test_identifiers_dates_and_plain_words_stay_readable(text):
    assert mask_text(text) == text


# -- tokens -----------------------------------------------------------------------------

OLD_TOKEN = uuid.UUID("7d3f6c2a-91b4-4e57-8a0c-2f1e9d8b7c6a").hex      # before derived tokens: uuid4().hex


@pytest.mark.parametrize("token", [TOKEN, OLD_TOKEN], ids=["derived", "random"])
def test_a_token_is_masked_in_its_fields_and_in_free_text(token):
    stale = (f"already cancelled; but attempt 1 ended sms_unknown and may have reached the sms service: look for "
             f"what it did under idempotency token {token} and undo it if it must not stand")
    answer = {"steps": [{"biz_key": "ORD-20261129-A1:ORDER_CANCEL:send_cancel_sms", "idem_token": token,
                         "last_err": stale}],
              "receipts": [{"waybill_no": "WB0000000001", "idem_token": token}],
              "record": {"value": {"text": json.dumps({"client_ref": token, "Idempotency-Key": token})}},
              "message": f"SMS for ORD-20261129-A1: refused with 422: {{\"client_ref\": \"{token.upper()}\"}}",
              "owner": f"w1/worker/{token}"}                               # a known token, even in an identifier
    masked = mask_answer(answer)
    text = json.dumps(masked)
    assert token not in text.lower() and token[:16] not in text.lower(), text
    assert masked["steps"][0]["idem_token"] == "***" + token[-4:] and masked["receipts"][0]["waybill_no"] == "WB0000000001"
    assert f"under idempotency token ***{token[-4:]} and undo it" in masked["steps"][0]["last_err"]


def test_a_token_in_text_is_found_without_knowing_it_and_in_the_shape_of_a_uuid_when_known():
    assert mask_text(f"look under idempotency token {TOKEN}.") == f"look under idempotency token ***{TOKEN[-4:]}."
    dashed = str(uuid.UUID(TOKEN))
    assert dashed not in json.dumps(mask_answer({"idem_token": TOKEN, "note": f"provider ref {dashed}"}))


# -- what the masker is told, and what it looks up ------------------------------------------

def test_a_cancel_reason_in_a_record_is_free_text_though_reason_names_an_identifier_elsewhere():
    doc = {"event_id": "e-20261129-0001", "order_no": "ORD-20261129-A1", "type": "ORDER_CANCEL",
           "occurred_at": "2026-11-29T10:00:00+08:00",
           "data": {"reason": "call me back on 13800138000 or jane@example.com at 12 Main Street"}}
    value = json.dumps(doc).encode()
    masked = mask_letter({**detail(value), "reason": "effect_not_delivered"}, value)
    shown = json.loads(masked["record"]["value"]["text"])
    assert shown["data"]["reason"] == "call me back on ***8000 or j***@*** at 12 ***"
    assert shown["event_id"] == "e-20261129-0001" and masked["reason"] == "effect_not_delivered"


def test_a_record_cut_short_is_withheld_and_its_orders_contacts_are_masked_in_the_messages():
    value = json.dumps({"order_no": "ORD-20261129-A1", "data": {"address": ZH_ADDRESS}}).encode()[:40]
    letter = {**detail(value, truncated=True),
              "message": f"refused with 422: {repr(ZH_ADDRESS.encode())} {quote(ZH_PHONE)}"}
    masked = mask_letter(letter, value, CONTACTS)
    assert "withheld" in masked["record"]["value"] and secrets_in(json.dumps(masked, ensure_ascii=False)) == []


@pytest.mark.parametrize("orders", [3, 120], ids=["a few orders", "a list of many orders"])
def test_every_orders_contacts_are_found_in_a_list_that_names_many_orders(orders):
    # Addresses no shape finds, each starting differently (the lookup's index has many entries).
    contacts = [{"phone": f"+4930{n:08d}", "address": f"{n:03d} Königsallee Hinterhaus"} for n in range(orders)]
    items = [{"order_no": f"ORD-20261129-L{n}", "message": f"refused with 422: {quote(c['address'])} / {c['phone']}",
              "note": f"courier: {c['address'][:-4]}"} for n, c in enumerate(contacts)]          # the note cut short
    text = json.dumps(mask_answer({"items": items}, contacts), ensure_ascii=False)
    assert [c for c in contacts if c["address"][:12] in text or quote(c["address"][:12]) in text] == []
    assert "+4930" not in text and "ORD-20261129-L0" in text


def test_a_known_value_inside_an_order_number_or_a_date_leaves_it_readable():
    answer = {"order": {"phone": "1129"}, "biz_key": "ORD-20261129-A1129:ORDER_PAID:mark_paid",
              "note": "paid 2026-11-29, call 1129"}
    masked = mask_answer(answer)
    assert masked["biz_key"] == answer["biz_key"] and masked["note"] == "paid 2026-11-29, call ***"


def test_the_order_numbers_an_answer_names_are_found_anywhere_in_it():
    answer = {"order_no": "ORD-20261129-A1", "steps": [{"biz_key": "ORD-20261129-B2:ORDER_PAID:mark_paid"}],
              "sample": "SMS for ORD-20261129-C3: answered 503", "raw": b'{"order_no": "ORD-20261129-D4", "da'}
    assert order_numbers(answer, b"ORD-20261129-E5\xff") == [f"ORD-20261129-{n}" for n in ("A1", "B2", "C3", "D4", "E5")]


def test_keys_of_a_record_are_masked_like_its_values():
    value = json.dumps({"data": {"13800138000": "primary", "notes": {"jane@example.com": 1}}}).encode()
    text = mask_letter(detail(value), value)["record"]["value"]["text"]
    assert "13800138000" not in text and "jane@example.com" not in text and '"***8000": "primary"' in text


def test_an_email_field_and_bytes_in_an_answer_are_masked():
    masked = mask_answer({"contact_email": "jane@example.com", "blob": b"call 13800138000"})
    assert masked["contact_email"] == "j***@***" and masked["blob"]["text"] == "call ***8000"
