"""The event contract: what decodes, and the exact reason for what does not."""

from __future__ import annotations

import json
from datetime import date

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.pipeline.errors import MalformedEvent
from app.pipeline.events import EventType, decode, part_date_of, payload_hash
from harness.events import event, record

MAX = 1024 * 1024
ORDER = "ORD-20260915-88231"


def doc(**overrides) -> dict:
    base = {"event_id": "e-1", "order_no": ORDER, "type": "ORDER_CREATED",
            "occurred_at": "2026-09-15T10:00:00+08:00",
            "data": {"amount_cents": 100, "phone": "+86138", "address": "1 Road"}}
    base.update(overrides)
    return base


def enc(d) -> bytes:
    return json.dumps(d).encode()


def reason(key: bytes | None, value: bytes | None) -> str:
    with pytest.raises(MalformedEvent) as info:
        decode(key, value, max_bytes=MAX)
    return info.value.reason


def test_valid_event_decodes_with_partition_date_and_hash():
    event = decode(ORDER.encode(), enc(doc(extra="ignored")), max_bytes=MAX)
    assert event.type is EventType.CREATED
    assert event.part_date == date(2026, 9, 15)
    assert event.data == {"amount_cents": 100, "phone": "+86138", "address": "1 Road"}
    assert len(event.payload_hash) == 64


@pytest.mark.parametrize("value, expected", [
    (None, "empty_value"),
    (b"\xff\xfe", "not_utf8"),
    (b"{not json", "not_json"),
    (b"[1, 2]", "not_object"),
    (b'"text"', "not_object"),
    (enc(doc(type="ORDER_SHIPPED")), "unknown_type"),
    (enc({k: v for k, v in doc().items() if k != "event_id"}), "missing_field:event_id"),
    (enc(doc(order_no=12)), "bad_field:order_no"),
    (enc(doc(order_no="ORDER-1")), "bad_order_no"),
    (enc(doc(order_no="ORD-20261345-1")), "bad_order_no"),
    (enc(doc(occurred_at="yesterday")), "bad_field:occurred_at"),
    (enc(doc(occurred_at="2026-09-15T10:00:00")), "bad_field:occurred_at"),
    (enc(doc(occurred_at="20260915T100000+0800")), "bad_field:occurred_at"),
    (enc(doc(occurred_at="2026-09-15T10:00+08:00")), "bad_field:occurred_at"),
    (enc(doc(order_no="ORD-\uff12\uff10\uff12\uff16\uff10\uff19\uff11\uff15-1")), "bad_order_no"),
    (enc(doc(data=[])), "bad_field:data"),
    (enc(doc(data={"phone": "1", "address": "a"})), "missing_field:data.amount_cents"),
    (enc(doc(data={"amount_cents": "100", "phone": "1", "address": "a"})), "bad_field:data.amount_cents"),
    (enc(doc(data={"amount_cents": True, "phone": "1", "address": "a"})), "bad_field:data.amount_cents"),
    (enc(doc(data={"amount_cents": -1, "phone": "1", "address": "a"})), "bad_field:data.amount_cents"),
    (enc(doc(data={"amount_cents": 1, "phone": "", "address": "a"})), "bad_field:data.phone"),
    (enc(doc(data={"amount_cents": 1, "phone": "1", "address": "a" * 513})), "bad_field:data.address"),
    (enc(doc(type="ORDER_CANCEL", data={})), "missing_field:data.reason"),
])
def test_malformed_values_name_their_reason(value, expected):
    assert reason(ORDER.encode(), value) == expected


def test_oversized_record_is_refused_before_parsing():
    with pytest.raises(MalformedEvent) as info:
        decode(ORDER.encode(), enc(doc()), max_bytes=10)
    assert info.value.reason == "oversized"


def test_key_must_be_the_order_number():
    assert reason(None, enc(doc())) == "missing_key"
    assert reason(b"ORD-20260915-00000", enc(doc())) == "key_mismatch"


def test_payload_hash_ignores_event_id_and_time_but_not_data():
    a = decode(ORDER.encode(), enc(doc()), max_bytes=MAX)
    b = decode(ORDER.encode(), enc(doc(event_id="e-2", occurred_at="2026-09-16T00:00:00Z")), max_bytes=MAX)
    c = decode(ORDER.encode(), enc(doc(data={"amount_cents": 101, "phone": "+86138", "address": "1 Road"})),
               max_bytes=MAX)
    assert a.payload_hash == b.payload_hash != c.payload_hash
    assert payload_hash(ORDER, EventType.PAID, {"amount_cents": 1}) != payload_hash(ORDER, EventType.PAID,
                                                                                    {"amount_cents": 2})


def test_rfc3339_forms_are_accepted():
    for text in ("2026-09-15T10:00:00Z", "2026-09-15 10:00:00+08:00", "2026-09-15t10:00:00.123456789z"):
        assert decode(ORDER.encode(), enc(doc(occurred_at=text)), max_bytes=MAX).occurred_at.tzinfo is not None


def test_partition_date_comes_from_the_order_number_alone():
    assert part_date_of("ORD-20260101-X") == date(2026, 1, 1)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_decode_or_raise_malformed_never_anything_else(value):
    try:
        decode(ORDER.encode(), value, max_bytes=MAX)
    except MalformedEvent as exc:
        assert exc.reason


def test_an_order_dated_past_the_months_kept_ready_is_malformed():
    """ORD-20991231-...: it would land in t_idem's catch-all partition, which every monthly split
    copies while writes wait. Refused with the reason; the last day of the last month kept is not."""
    from datetime import date

    from app.pipeline.retention import Retention

    retention = Retention(90, today=lambda: date(2026, 12, 1), ahead=3)
    assert retention.latest() == date(2027, 3, 31)
    ok = event("ORD-20270331-A1", "ORDER_CREATED")
    assert decode(*record(ok), max_bytes=1 << 20, latest=retention.latest()).part_date == date(2027, 3, 31)
    for day in ("20270401", "20991231"):
        far = event(f"ORD-{day}-A1", "ORDER_CREATED")
        with pytest.raises(MalformedEvent) as refused:
            decode(*record(far), max_bytes=1 << 20, latest=retention.latest())
        assert refused.value.reason == "bad_order_no" and "after 2027-03-31" in str(refused.value)
    assert Retention(90, today=lambda: date(2026, 11, 30), ahead=1).latest() == date(2026, 12, 31)


def test_a_leap_day_is_a_date():
    assert part_date_of("ORD-20280229-A1") == date(2028, 2, 29)
