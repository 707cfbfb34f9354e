"""A type not handled is skipped only when it is not a handled one in disguise: equal but for case,
spaces or separators, or containing a handled type's name (a rename, a namespace), is dead-lettered
naming the type it resembles, unless FOREIGN_EVENT_TYPES declares it another team's; and a record
whose CloudEvents headers and native body name two types is dead-lettered as ambiguous."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from app.bootstrap import event_reading
from app.pipeline.envelopes import Envelope, Reading, reading_of
from app.pipeline.errors import AmbiguousType, LookalikeType, UnhandledType
from app.pipeline.events import EventType, decode
from app.pipeline.lookalikes import resembled, squash
from app.settings.events import EventsSettings

MAX = 1 << 20
ORDER = "ORD-20260915-88231"
HANDLED = tuple((t.value, t.value) for t in EventType)


def native(type_: str, **more) -> bytes:
    data = {"ORDER_CONFIRM": {}, "ORDER_PAID": {"amount_cents": 100}}.get(type_, {"amount_cents": 100})
    return json.dumps({"event_id": "e-1", "order_no": ORDER, "type": type_, "occurred_at": "2026-09-15T10:00:00Z",
                       "data": data, **more}).encode()


def ce_headers(ce_type: str) -> tuple[tuple[str, bytes], ...]:
    return (("ce_specversion", b"1.0"), ("ce_id", b"e-1"), ("ce_source", b"/relay"), ("ce_type", ce_type.encode()),
            ("ce_time", b"2026-09-15T10:00:00Z"), ("ce_subject", ORDER.encode()))


def decoded(value: bytes, headers=(), reading: Reading | None = None):
    return decode(ORDER.encode(), value, max_bytes=MAX, headers=headers, reading=reading or Reading())


@pytest.mark.parametrize("name", ["order_paid", "ORDER_PAID ", " ORDER_PAID", "Order-Paid", "ORDER.PAID", "OrderPaid",
                                  "order paid", "ORDER__PAID", "ｏｒｄｅｒ＿ｐａｉｄ", "\tORDER_PAID\n", "ORDER/PAID"])
def test_a_handled_type_but_for_case_spaces_or_separators_is_dead_lettered_naming_it(name):
    with pytest.raises(LookalikeType) as info:
        decoded(native(name))
    assert info.value.reason == "lookalike_type" and info.value.handled == "ORDER_PAID"
    assert "is ORDER_PAID but for case, spaces or separators" in str(info.value)
    assert repr(name[:60]) in str(info.value)


@pytest.mark.parametrize("name, handled", [("ORDER_CONFIRMED", "ORDER_CONFIRM"), ("ORDER_CONFIRM_V2", "ORDER_CONFIRM"),
                                           ("com.shop.order.confirm", "ORDER_CONFIRM"),
                                           ("shop.order.paid.v1", "ORDER_PAID"), ("ORDER_CANCELLED", "ORDER_CANCEL"),
                                           ("OrderCreatedEvent", "ORDER_CREATED")])
def test_a_type_containing_a_handled_one_is_dead_lettered_as_a_rename(name, handled):
    with pytest.raises(LookalikeType) as info:
        decoded(native(name))
    assert info.value.handled == handled
    assert f"contains {handled}" in str(info.value)


@pytest.mark.parametrize("name", ["ORDER_SHIPPED", "ORDER_DELIVERED", "ORDER_REFUNDED", "ORDER_TELEPORTED",
                                  "com.shop.order.delivered", "PAYMENT_CAPTURED", "注文", "ORDER", "PAID"])
def test_another_teams_type_is_skipped(name):
    with pytest.raises(UnhandledType) as info:
        decoded(native(name))
    assert type(info.value) is UnhandledType and info.value.type_name == name


def test_a_declared_foreign_type_is_skipped_even_when_it_looks_like_a_handled_one():
    reading = reading_of("auto", {}, {}, "1", "skip", "ORDER_CANCEL_REQUESTED, ORDER_SHIPPED")
    assert reading.foreign == {"ORDER_CANCEL_REQUESTED", "ORDER_SHIPPED"}
    with pytest.raises(UnhandledType) as info:
        decoded(native("ORDER_CANCEL_REQUESTED"), reading=reading)
    assert type(info.value) is UnhandledType
    with pytest.raises(LookalikeType):             # exact names only: a disguise of it is not declared
        decoded(native("order_cancel_requested"), reading=reading)


def test_strict_mode_names_the_lookalike_too_and_a_mapped_name_is_read():
    strict = Reading(skip_unhandled=False)
    with pytest.raises(LookalikeType):
        decoded(native("order_paid"), reading=strict)
    mapped = Reading(type_names={"order_paid": "ORDER_PAID"})
    assert decoded(native("order_paid"), reading=mapped).type is EventType.PAID


def test_an_upstream_name_in_disguise_names_the_upstream_name_and_its_type():
    reading = Reading(type_names={"com.shop.order.shipped-out": "ORDER_CONFIRM"})
    headers = ce_headers("COM.SHOP.ORDER.SHIPPED_OUT")
    with pytest.raises(LookalikeType) as info:
        decoded(json.dumps({}).encode(), headers, reading)
    assert info.value.handled == "ORDER_CONFIRM"
    assert "is com.shop.order.shipped-out (read as ORDER_CONFIRM, EVENT_TYPES)" in str(info.value)


def test_the_squashed_form_and_the_most_specific_resemblance():
    assert squash(" Order-Paid. ") == squash("ORDER_PAID") == "orderpaid"
    assert squash("") == "" and resembled("---", HANDLED) is None
    both = (*HANDLED, ("com.shop.order.confirm.v2", "ORDER_CONFIRM"))
    like = resembled("com.shop.order.confirm.v2", both)
    assert like is not None and (like.name, like.equal) == ("com.shop.order.confirm.v2", True)
    like = resembled("x.com.shop.order.confirm.v2.y", both)
    assert like is not None and (like.name, like.equal) == ("com.shop.order.confirm.v2", False)


def test_ce_headers_on_a_native_body_that_say_another_type_are_ambiguous():
    # A relay that starts adding ce_* headers to native records: every CONFIRM a type not handled.
    with pytest.raises(AmbiguousType) as info:
        decoded(native("ORDER_CONFIRM"), ce_headers("com.shop.order.confirm"))
    message = str(info.value)
    assert info.value.reason == "ambiguous_type"
    assert "'com.shop.order.confirm' (read from ce:type) is a type this processor does not handle" in message
    assert "body's own type 'ORDER_CONFIRM' is ORDER_CONFIRM" in message and "EVENT_ENVELOPE=native" in message
    with pytest.raises(AmbiguousType):              # not skipped, also where the header's type is another team's
        decoded(native("ORDER_CONFIRM"), ce_headers("ORDER_SHIPPED"))
    with pytest.raises(AmbiguousType) as info:      # two handled types
        decoded(native("ORDER_CANCEL", data={"reason": "r"}), ce_headers("ORDER_PAID"))
    assert "is ORDER_PAID, but its body's own type 'ORDER_CANCEL' is ORDER_CANCEL" in str(info.value)
    forced = Reading(envelope=Envelope.CLOUDEVENTS)
    with pytest.raises(AmbiguousType):
        decoded(native("ORDER_CONFIRM"), ce_headers("com.shop.order.confirm"), forced)


def test_ce_headers_that_agree_with_the_body_or_data_without_a_handled_type_are_read():
    assert decoded(native("ORDER_CONFIRM"), ce_headers("ORDER_CONFIRM")).type is EventType.CONFIRM
    mapped = Reading(type_names={"com.shop.order.confirm": "ORDER_CONFIRM"})
    assert decoded(native("ORDER_CONFIRM"), ce_headers("com.shop.order.confirm"), mapped).type is EventType.CONFIRM
    # A CloudEvent whose data has a business field named type: not a type of this processor.
    data = json.dumps({"reason": "r", "type": "ORDER_CANCEL_BY_CUSTOMER"}).encode()
    assert decoded(data, ce_headers("ORDER_CANCEL")).type is EventType.CANCEL
    with pytest.raises(UnhandledType):
        decoded(json.dumps({"type": "express"}).encode(), ce_headers("com.shop.order.delivered"))
    # The native envelope never looks at headers: the body's type is the type.
    assert decoded(native("ORDER_CONFIRM"), ce_headers("x"), Reading(envelope=Envelope.NATIVE)).type \
        is EventType.CONFIRM


def test_the_settings_read_foreign_types_and_refuse_one_this_processor_reads():
    assert event_reading(EventsSettings(foreign=" ORDER_SHIPPED ,,X ")).foreign == {"ORDER_SHIPPED", "X"}
    assert event_reading(EventsSettings()).foreign == frozenset()
    for settings in ({"foreign": "ORDER_PAID"}, {"foreign": "com.x", "type_names": "com.x=ORDER_PAID"}):
        with pytest.raises(ValidationError, match="FOREIGN_EVENT_TYPES names"):
            EventsSettings(**settings)


def test_a_type_is_compared_by_its_first_characters_only():
    long = "X" * 1_000_000
    with pytest.raises(UnhandledType) as info:
        decoded(native(long))
    assert info.value.type_name == "X" * 64
    with pytest.raises(UnhandledType):                 # the handled name past the first 256 characters
        decoded(native("Y" * 300 + "ORDER_PAID"))
    with pytest.raises(LookalikeType):
        decoded(native("Y" * 200 + "ORDER_PAID"))
