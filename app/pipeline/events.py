"""The event contract of topic ``order-event`` and its decoder.

Key: the ``order_no`` as UTF-8. Value: a UTF-8 JSON object::

    {"event_id": "...", "order_no": "ORD-20260915-88231",
     "type": "ORDER_CREATED" | "ORDER_PAID" | "ORDER_CONFIRM" | "ORDER_CANCEL",
     "occurred_at": "<RFC 3339 with offset>", "data": {...}}

Unknown fields are ignored; a missing or ill-typed required field makes the
event malformed, with a reason naming the field (``missing_field:data.phone``).
A type not among the four is :class:`UnhandledType` (skipped, unless strict), unless it looks like
one of them (:class:`LookalikeType`, ``order_paid``: :mod:`app.pipeline.lookalikes`); a record whose
envelope and body name two types is :class:`AmbiguousType`; a ``schema_version`` not among those read
is ``unsupported_version:<v>``. The same
fields may come in a CloudEvent or a Debezium outbox record
(:mod:`app.pipeline.envelopes`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from enum import Enum
from functools import lru_cache
from typing import Any

import orjson

from app.pipeline.envelopes import Envelope, Reading, version_of
from app.pipeline.errors import AmbiguousType, LookalikeType, MalformedEvent, UnhandledType
from app.pipeline.excerpts import excerpt
from app.pipeline.frozen import quick_init
from app.pipeline.lookalikes import resembled

ORDER_NO = re.compile(r"ORD-([0-9]{4})([0-9]{2})([0-9]{2})-[A-Za-z0-9]{1,40}")
# RFC 3339 date-time (section 5.6), ASCII digits only; a space may replace the T.
RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})")


class EventType(str, Enum):
    CREATED = "ORDER_CREATED"
    PAID = "ORDER_PAID"
    CONFIRM = "ORDER_CONFIRM"
    CANCEL = "ORDER_CANCEL"


# Required ``data`` fields per type: name -> (Python type, bound). The bound is
# the longest string the column takes, or the largest amount.
DATA_FIELDS: dict[EventType, dict[str, tuple[type, int]]] = {
    EventType.CREATED: {"amount_cents": (int, 10**15), "phone": (str, 32), "address": (str, 512)},
    EventType.PAID: {"amount_cents": (int, 10**15)},
    EventType.CONFIRM: {},
    EventType.CANCEL: {"reason": (str, 255)},
}
MAX_EVENT_ID = 64
NATIVE = Reading()          # the defaults: native or CloudEvents as the record says, unhandled types skipped


@quick_init
@dataclass(frozen=True, slots=True)
class OrderEvent:
    """A decoded, valid event. ``data`` holds the contract's fields only."""

    event_id: str
    order_no: str
    type: EventType
    occurred_at: datetime
    data: Mapping[str, Any]
    part_date: date
    payload_hash: str


@lru_cache(maxsize=65536)
def part_date_of(order_no: str) -> date:
    """The partition date of an order: the date inside its number, ``ORD-YYYYMMDD-...``.

    It is a function of the business key alone, so every event and every
    re-published duplicate of an order maps to the same ``t_idem`` partition.
    """
    match = ORDER_NO.fullmatch(order_no)
    if match is None:
        raise MalformedEvent(f"order_no {order_no[:80]!r} is not ORD-YYYYMMDD-<1..40 letters or digits>",
                             reason="bad_order_no")
    year, month, day = (int(g) for g in match.groups())
    try:
        return date(year, month, day)
    except ValueError:
        raise MalformedEvent(f"order_no {order_no!r} carries an impossible date", reason="bad_order_no") from None


def payload_hash(order_no: str, type_: EventType, data: Mapping[str, Any]) -> str:
    """SHA-256 of what the event asks for: order, type and contract data.

    ``event_id`` and ``occurred_at`` are left out on purpose: a producer that
    re-publishes the same request under a new id is a duplicate, not a conflict.
    """
    canonical = orjson.dumps([order_no, type_.value, data], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def decode(key: bytes | None, value: bytes | None, *, max_bytes: int, latest: date | None = None,
           headers: Sequence[tuple[str, bytes | None]] = (), timestamp_ms: int | None = None,
           reading: Reading = NATIVE) -> OrderEvent:
    """Decode one record or raise :class:`MalformedEvent` with a precise reason (:class:`UnhandledType`
    for a type this processor does not act on). An order dated after ``latest`` (the last month
    ``t_idem`` keeps ready) is malformed. ``reading`` says the envelope and where its fields are
    (:mod:`app.pipeline.envelopes`); the checks are the same for every envelope."""
    if value is None:
        raise MalformedEvent("record has no value (tombstone)", reason="empty_value")
    if len(value) > max_bytes:
        raise MalformedEvent(f"value is {len(value)} bytes, over the {max_bytes}-byte limit", reason="oversized")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedEvent(f"value is not UTF-8: {exc}", reason="not_utf8") from None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise MalformedEvent(f"value is not JSON: {exc}", reason="not_json") from None
    places = own = None
    if not reading.native_only() and reading.envelope_of(headers, doc) is not Envelope.NATIVE or reading.sources:
        doc, places, own = reading.read(key, doc, headers, timestamp_ms)
    elif not isinstance(doc, dict):
        raise MalformedEvent(f"value is a JSON {type(doc).__name__}, not an object", reason="not_object")

    raw_type = doc.get("type")
    type_ = _TYPES.get(raw_type) if type(raw_type) is str else None
    if type_ is None and type(raw_type) is str and raw_type.strip():
        type_ = _TYPES.get(reading.type_names.get(raw_type, ""))
        if own is not None:
            _one_type(raw_type, type_, own, places, reading)
        if type_ is None:
            raise _unhandled(raw_type, reading)
    elif own is not None and type_ is not None:
        _one_type(raw_type, type_, own, places, reading)
    event_id = _str(doc, "event_id", MAX_EVENT_ID, places)
    order_no = _str(doc, "order_no", 64, places)
    if type_ is None:
        _str(doc, "type", 64, places)        # missing or not a string: says which
    assert type_ is not None
    if "schema_version" in doc:
        version = version_of(doc["schema_version"])
        if version not in reading.versions:
            shown = re.sub(r"[^A-Za-z0-9._-]", "_", version)[:16] or "unreadable"
            raise MalformedEvent(f"{type_.value} version {str(doc['schema_version'])[:80]!r} is not one this processor "
                                 f"reads ({', '.join(sorted(reading.versions))}; EVENT_SCHEMA_VERSIONS)",
                                 reason=f"unsupported_version:{shown}")
    occurred_at = _timestamp(_str(doc, "occurred_at", 64, places))
    raw_data = doc.get("data")
    if type(raw_data) is not dict:
        raw_data = _field(doc, "data", dict, places=places)
    data = {}
    for name, kind, bound in _DATA[type_]:
        field = raw_data.get(name)
        # The usual case in one test; anything else gets _field's precise verdict.
        if (type(field) is int and 0 <= field <= bound if kind is int else
                kind is str and type(field) is str and field and len(field) <= bound and not field.isspace()):
            data[name] = field
        else:
            data[name] = _field(raw_data, name, kind, bound, prefix="data.")

    part = part_date_of(order_no)
    if latest is not None and part > latest:
        raise MalformedEvent(f"order_no {order_no!r} is dated {part.isoformat()}, after {latest.isoformat()}, the last "
                             "day of the months the dedup store keeps ready (today plus PARTITIONS_AHEAD months): "
                             "not a real order date", reason="bad_order_no")
    if key is None:
        raise MalformedEvent("record has no key; the key must be the order_no", reason="missing_key")
    if key != order_no.encode():
        raise MalformedEvent(f"record key \"{excerpt(key, 80)}\" differs from order_no {order_no!r}", reason="key_mismatch")
    return OrderEvent(event_id, order_no, type_, occurred_at, data, part, payload_hash(order_no, type_, data))


def check_headers(headers) -> None:
    """Refuse a record with a header key that is not UTF-8 (librdkafka writes raw bytes;
    the consumer keeps them as surrogate escapes). No contract field lives in headers,
    but a record no other client can read back must not pass as a good event."""
    for name, _ in headers:
        if name.isascii():
            continue
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raw = name.encode("utf-8", "surrogateescape")
            raise MalformedEvent(f"header key \"{excerpt(raw, 80)}\" is not UTF-8", reason="header_not_utf8") from None


def _unhandled(raw_type: str, reading: Reading) -> MalformedEvent:
    """A type not handled: skipped (:class:`UnhandledType`), unless it looks like a handled one
    (:class:`LookalikeType`, ``app.pipeline.lookalikes``) and ``FOREIGN_EVENT_TYPES`` does not name it."""
    if raw_type not in reading.foreign:
        like = resembled(raw_type, (*_OWN_NAMES, *reading.type_names.items()))
        if like is not None:
            return LookalikeType(raw_type, like.handled, like.says())
    return UnhandledType(raw_type)


def _one_type(raw_type: str, type_: EventType | None, own: str, places: Mapping[str, str] | None,
              reading: Reading) -> None:
    """Refuse a record whose body's own ``type`` is a handled type other than the one the envelope
    says (``type_``; None: not handled). A relay that adds ``ce_*`` headers to native records turns
    every ``ORDER_CONFIRM`` into a ``com.shop.order.confirm`` this processor would skip; a CloudEvent
    whose data merely quotes another event would be acted on if the body won. Neither is guessed."""
    said = _TYPES.get(own) or _TYPES.get(reading.type_names.get(own, ""))
    if said is None or said is type_:
        return
    where = (places or {}).get("type", "the envelope")
    envelope_says = f"{type_.value}" if type_ is not None else "a type this processor does not handle"
    raise AmbiguousType(f"the record's type {raw_type[:60]!r} (read from {where}) is {envelope_says}, but its body's "
                        f"own type {own[:60]!r} is {said.value}: dead-lettered as ambiguous, neither guessed. A relay "
                        "that adds CloudEvents headers to native records: EVENT_ENVELOPE=native; an upstream's name "
                        "for that type: EVENT_TYPES")


_TYPES = {t.value: t for t in EventType}
_OWN_NAMES = tuple((t.value, t.value) for t in EventType)
# DATA_FIELDS as tuples, for the decoder's loop.
_DATA = {t: tuple((name, kind, bound) for name, (kind, bound) in fields.items()) for t, fields in DATA_FIELDS.items()}


def _str(doc: Mapping[str, Any], name: str, bound: int, places: Mapping[str, str] | None = None) -> str:
    """``_field(doc, name, str, bound)``, with the usual case (a non-blank str within bound) in one test."""
    value = doc.get(name)
    if type(value) is str and value and len(value) <= bound and not value.isspace():
        return value
    return _field(doc, name, str, bound, places=places)


def _field(doc: Mapping[str, Any], name: str, kind: type, bound: int = 0, *, prefix: str = "",
           places: Mapping[str, str] | None = None) -> Any:
    """``doc[name]`` if it is a ``kind`` within ``bound`` (length of a str, value of an int). ``places``:
    where the envelope's fields were read from, for the messages."""
    label = prefix + name
    if name not in doc or doc[name] is None:
        where = f" (read from {places[name]})" if places and name in places else ""
        raise MalformedEvent(f"required field {label}{where} is missing", reason=f"missing_field:{label}")
    value = doc[name]
    # bool is an int subclass; true is not an amount.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedEvent(f"field {label} must be {kind.__name__}, got {type(value).__name__}",
                             reason=f"bad_field:{label}")
    # A str or an int here is of ``kind`` (the check above let no other type through, and no bool).
    if isinstance(value, str):
        if not value.strip():
            raise MalformedEvent(f"field {label} is empty", reason=f"bad_field:{label}")
        if len(value) > bound:
            raise MalformedEvent(f"field {label} is longer than {bound} characters", reason=f"bad_field:{label}")
    elif isinstance(value, int) and not 0 <= value <= bound:
        raise MalformedEvent(f"field {label} must be between 0 and {bound}", reason=f"bad_field:{label}")
    return value


def _timestamp(text: str) -> datetime:
    if RFC3339.fullmatch(text) is None:
        raise MalformedEvent(f"occurred_at {text[:60]!r} is not an RFC 3339 date-time with an offset",
                             reason="bad_field:occurred_at")
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        pass
    # fromisoformat wants an upper-case T and Z and at most 6 fraction digits; RFC 3339 allows more.
    try:
        return datetime.fromisoformat(re.sub(r"(\.[0-9]{6})[0-9]+", r"\1", text.upper().replace(" ", "T")))
    except ValueError:
        raise MalformedEvent(f"occurred_at {text[:60]!r} is not a valid date-time",
                             reason="bad_field:occurred_at") from None
