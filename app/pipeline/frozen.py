"""A quicker ``__init__`` for the frozen dataclasses a worker makes for every record.

The ``__init__`` that ``dataclasses`` writes for a frozen class sets each field with
``object.__setattr__(self, "name", value)``: a lookup of the name on every call. On CPython 3.11
that makes a frozen class several times dearer to build than an unfrozen one, and a batch builds
four of them per event (the record, the decoded event, its ``t_idem`` row, the order it moves).
:func:`quick_init` gives such a class an ``__init__`` that calls each field's slot descriptor
directly, which takes back much of that (the figures: the docs' Benchmarks page and bench/results/history.md;
``python -m bench.hot_path`` measures the plan per event). Nothing else changes: the signature and
defaults, assignment still raises ``FrozenInstanceError``, equality, hashing and ``repr`` are
still the ones ``dataclasses`` made.
"""

from __future__ import annotations

import dataclasses
from types import FunctionType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")


def quick_init(cls: type[C]) -> type[C]:
    """Replace ``cls.__init__`` (a frozen, slotted dataclass with plain fields) with the quicker one."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: quick_init is for @dataclass(frozen=True, slots=True) classes")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: quick_init does not run __post_init__")
    names: list[str] = []
    scope: dict[str, object] = {}
    for field in dataclasses.fields(cls):
        if not field.init or field.kw_only or field.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{field.name}: quick_init takes only positional init fields without a factory")
        names.append(field.name)
        scope[f"_set_{field.name}"] = cls.__dict__[field.name].__set__   # the slot's member descriptor
        if field.default is not dataclasses.MISSING:
            scope[f"_default_{field.name}"] = field.default
    signature = ", ".join(name if f"_default_{name}" not in scope else f"{name}=_default_{name}" for name in names)
    body = "".join(f"    _set_{name}(self, {name})\n" for name in names) or "    pass\n"
    code = f"def __init__(self, {signature}):\n{body}"
    made: dict[str, Any] = {}
    exec(code, scope, made)
    init: FunctionType = made["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init     # type: ignore[method-assign]  # replacing the class's __init__ is the point
    return cls
