"""The envelopes upstreams publish: a CloudEvent (binary and structured) and a Debezium outbox record
read into the same event as the native record, types not handled set apart, versions checked, and
the settings that say where each field is."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from app.bootstrap import event_reading
from app.pipeline.envelopes import Envelope, Reading, version_of
from app.pipeline.errors import MalformedEvent, UnhandledType
from app.pipeline.events import EventType, decode
from app.settings.events import HANDLED, EventsSettings

MAX = 1 << 20
ORDER = "ORD-20260915-88231"
DATA = {"amount_cents": 100, "phone": "+86138", "address": "1 Road"}
NATIVE_DOC = {"event_id": "e-1", "order_no": ORDER, "type": "ORDER_CREATED",
              "occurred_at": "2026-09-15T10:00:00+08:00", "data": DATA}
CE_HEADERS = (("ce_specversion", b"1.0"), ("ce_id", b"e-1"), ("ce_source", b"/orders"),
              ("ce_type", b"ORDER_CREATED"), ("ce_time", b"2026-09-15T10:00:00+08:00"),
              ("ce_subject", ORDER.encode()), ("content-type", b"application/json"))
OUTBOX_HEADERS = (("id", b"e-1"), ("eventType", b"ORDER_CREATED"))
STAMP = 1_757_901_600_000          # 2025-09-15T02:00:00Z


def enc(doc) -> bytes:
    return json.dumps(doc).encode()


def native():
    return decode(ORDER.encode(), enc(NATIVE_DOC), max_bytes=MAX)


def reason(value, headers=(), reading=None, key=None) -> str:
    with pytest.raises(MalformedEvent) as info:
        decode(ORDER.encode() if key is None else key, value, max_bytes=MAX, headers=headers,
               reading=reading or Reading(), timestamp_ms=STAMP)
    return info.value.reason


def test_a_binary_cloudevent_is_the_same_event_as_the_native_record():
    event = decode(ORDER.encode(), enc(DATA), max_bytes=MAX, headers=CE_HEADERS)
    assert event == native()


def test_a_structured_cloudevent_is_recognised_by_its_content_type_or_its_specversion():
    doc = {"specversion": "1.0", "id": "e-1", "source": "/orders", "type": "ORDER_CREATED", "subject": ORDER,
           "time": "2026-09-15T10:00:00+08:00", "datacontenttype": "application/json", "data": DATA}
    typed = (("content-type", b"application/cloudevents+json; charset=UTF-8"),)
    assert decode(ORDER.encode(), enc(doc), max_bytes=MAX, headers=typed) == native()
    assert decode(ORDER.encode(), enc(doc), max_bytes=MAX) == native()
    forced = Reading(envelope=Envelope.CLOUDEVENTS)
    assert decode(ORDER.encode(), enc(doc), max_bytes=MAX, reading=forced) == native()
    assert reason(enc({**doc, "data_base64": "e30="}), reading=forced) == "bad_field:data"


@pytest.mark.parametrize("payload", [enc(DATA), json.dumps(json.dumps(DATA)).encode()],
                         ids=["expanded", "json-string"])
def test_a_debezium_outbox_record_is_the_same_event_with_its_time_from_the_record(payload):
    reading = Reading(envelope=Envelope.OUTBOX)
    event = decode(ORDER.encode(), payload, max_bytes=MAX, headers=OUTBOX_HEADERS, timestamp_ms=STAMP,
                   reading=reading)
    assert (event.event_id, event.type, event.data, event.payload_hash) == (
        "e-1", EventType.CREATED, DATA, native().payload_hash)
    assert event.occurred_at.isoformat() == "2025-09-15T02:00:00+00:00"


def test_fields_come_from_where_the_settings_say():
    reading = event_reading(EventsSettings(envelope="outbox", time_from="field:createdAt", type_from="header:type",
                                           type_names="order.created=ORDER_CREATED"))
    payload = {**DATA, "createdAt": "2026-09-15T10:00:00+08:00"}
    event = decode(ORDER.encode(), enc(payload), max_bytes=MAX, reading=reading,
                   headers=(("id", b"e-1"), ("type", b"order.created")))
    assert event.payload_hash == native().payload_hash and event.occurred_at == native().occurred_at


def test_a_missing_field_says_where_it_was_looked_for():
    with pytest.raises(MalformedEvent) as info:
        decode(ORDER.encode(), enc(DATA), max_bytes=MAX, headers=(("eventType", b"ORDER_CREATED"),),
               reading=Reading(envelope=Envelope.OUTBOX), timestamp_ms=STAMP)
    assert info.value.reason == "missing_field:event_id"
    assert "header:id" in str(info.value)


def test_the_key_must_still_be_the_order_number():
    assert reason(enc(DATA), CE_HEADERS, key=b"other") == "key_mismatch"


def test_a_type_not_handled_is_told_apart_with_its_name_before_anything_else_is_checked():
    with pytest.raises(UnhandledType) as info:
        decode(None, enc({"type": "ORDER_SHIPPED"}), max_bytes=MAX)
    assert (info.value.type_name, info.value.reason) == ("ORDER_SHIPPED", "unknown_type")
    ce = tuple((k, b"com.shop.order.shipped" if k == "ce_type" else v) for k, v in CE_HEADERS)
    with pytest.raises(UnhandledType):
        decode(ORDER.encode(), enc(DATA), max_bytes=MAX, headers=ce)


def test_upstream_type_names_map_to_the_types_handled():
    reading = Reading(type_names={"com.shop.order.created": "ORDER_CREATED"})
    ce = tuple((k, b"com.shop.order.created" if k == "ce_type" else v) for k, v in CE_HEADERS)
    assert decode(ORDER.encode(), enc(DATA), max_bytes=MAX, headers=ce, reading=reading) == native()


@pytest.mark.parametrize("raw, version", [(2, "2"), ("v3", "3"), ("https://schemas.example/order/v2", "2"),
                                          ("https://schemas.example/order/1/", "1"), (True, ""), ("", "")])
def test_a_version_is_read_from_a_number_a_string_or_a_schema_uri(raw, version):
    assert version_of(raw) == version


def test_a_version_not_read_is_dead_lettered_with_a_reason_that_names_it():
    assert reason(enc({**NATIVE_DOC, "schema_version": 2})) == "unsupported_version:2"
    assert reason(enc({**NATIVE_DOC, "schema_version": "2;drop"})) == "unsupported_version:2_drop"
    two = Reading(versions=frozenset({"1", "2"}))
    assert decode(ORDER.encode(), enc({**NATIVE_DOC, "schema_version": 2, "new": 1}), max_bytes=MAX,
                  reading=two) == native()
    schema = (*CE_HEADERS, ("ce_dataschema", b"https://schemas.example/order-created/v2"))
    assert reason(enc(DATA), schema) == "unsupported_version:2"
    assert decode(ORDER.encode(), enc(DATA), max_bytes=MAX, headers=schema, reading=two) == native()


def test_a_header_that_is_not_utf8_is_malformed():
    bad = tuple((k, b"\xff" if k == "ce_id" else v) for k, v in CE_HEADERS)
    assert reason(enc(DATA), bad) == "not_utf8"


@pytest.mark.parametrize("field, value", [("id_from", "head:id"), ("type_from", "key:x"), ("data_from", "field:"),
                                          ("type_names", "x=ORDER_SHIPPED"), ("type_names", "x"),
                                          ("versions", " , "), ("unhandled", "drop"), ("envelope", "avro")])
def test_settings_refuse_what_they_cannot_read(field, value):
    with pytest.raises(ValidationError):
        EventsSettings(**{field: value})


def test_the_default_reading_is_auto_with_unhandled_types_skipped():
    assert event_reading(EventsSettings()) == Reading()
    assert event_reading(EventsSettings(unhandled="dead_letter")).skip_unhandled is False


def test_the_settings_know_the_types_handled():
    assert HANDLED == tuple(t.value for t in EventType)
