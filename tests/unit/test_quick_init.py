"""The quicker ``__init__`` of the per-record frozen dataclasses builds what ``dataclasses`` built."""

import dataclasses
from datetime import date

import pytest

from app.pipeline.events import OrderEvent
from app.pipeline.frozen import quick_init
from app.pipeline.model import IdemRow, NewRow
from app.pipeline.ports import SourceRecord
from app.pipeline.states import Order, OrderStatus


@dataclasses.dataclass(frozen=True, slots=True)
class Plain:
    a: int
    b: str = "b"
    c: tuple = ()


@quick_init
@dataclasses.dataclass(frozen=True, slots=True)
class Quick:
    a: int
    b: str = "b"
    c: tuple = ()


def fields_of(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def test_it_takes_the_same_arguments_and_defaults_and_stays_frozen():
    for args, kwargs in [((1,), {}), ((1, "x"), {}), ((1,), {"c": (2,)}), ((), {"a": 1, "b": "y", "c": ()})]:
        assert fields_of(Quick(*args, **kwargs)) == fields_of(Plain(*args, **kwargs))
    assert Quick(1) == Quick(1) and hash(Quick(1, "x")) == hash(Quick(1, "x")) and Quick(1) != Quick(2)
    assert repr(Quick(1)) == "Quick(a=1, b='b', c=())"
    with pytest.raises(dataclasses.FrozenInstanceError):
        Quick(1).a = 2
    with pytest.raises(TypeError):
        Quick()
    with pytest.raises(TypeError):
        Quick(1, b="x", d=3)


def test_it_refuses_a_class_it_would_get_wrong():
    @dataclasses.dataclass(slots=True)
    class Unfrozen:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        a: list = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (Unfrozen, Factory, Checked):
        with pytest.raises(TypeError):
            quick_init(cls)


def test_the_records_a_batch_makes_per_event_are_built_whole():
    assert fields_of(Order("ORD-20261203-A1", OrderStatus.PAID, paid_cents=5)) == {
        "order_no": "ORD-20261203-A1", "status": OrderStatus.PAID, "amount_cents": None, "phone": None,
        "address": None, "paid_cents": 5, "cancel_reason": None, "has_dead_letters": False}
    assert NewRow("k", date(2026, 12, 3), "s", 2, "h").outcome is None
    assert SourceRecord("t", 0, 1, None, b"k", b"v").headers == ()
    assert IdemRow("k", 2, 1, None, None, "h", None, None, False, 0.0).since_call == 0.0
    for cls in (Order, NewRow, SourceRecord, IdemRow, OrderEvent):
        assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"
