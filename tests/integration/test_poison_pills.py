"""Poison pills: a corpus of bad records, mixed among good events, through one real worker.

The worker is strict (``UNHANDLED_EVENT_TYPES=dead_letter``: a type not handled is a bad
record here). Every bad record must reach the dead-letter topic exactly once, byte for byte, with
the reason the event contract promises (``app.pipeline.events``) in ``dlq.error.type``
and headers pointing at the record it came from; every one gets one open row in
``t_compensation``; no good event is dead-lettered, every good event is done, and
the worker survives all of it.

The corpus is a table (``CASES``). ``test_decoder_classifies_case`` checks each
case against the decoder alone, one pytest id per case; the Kafka part is a single
worker run over the whole corpus (``test_poison_pills_are_dead_lettered_once_...``)
that collects every mismatch and names each failing case.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

import pytest

from app.adapters.kafka import ops as kafka_ops
from app.pipeline.errors import MalformedEvent
from app.pipeline.events import decode
from app.pipeline.plan import step_keys
from app.pipeline.retention import Retention
from app.pipeline.states import IdemStatus, OrderStatus
from harness import services
from harness.events import event, order_no, record
from harness.services import consume_all, end_offsets, wait_for

MAX_EVENT_BYTES = 1024 * 1024            # passed to the worker, so the size cases do not depend on the env
DLQ_TRUNCATE_BYTES = 64 * 1024           # likewise
RETRY_BACKOFF_MS = "50,100,150"          # three retries: a retriable failure is dead-lettered on attempt 4
GOOD_ORDERS = 100                        # CREATED + PAID each: 200 good events, plus the edge-case orders below
SEED = 20261129


# ------------------------------------------------------------------ corpus --

def _doc(type_: str = "ORDER_CREATED", *, order: str | None = None, data: dict | None = None, **fields) -> dict:
    """A valid event of a fresh order (never one of the good orders)."""
    return event(order or order_no(prefix="PPBAD"), type_, data, **fields)


def _without(doc: dict, path: str) -> dict:
    doc = json.loads(json.dumps(doc))
    *parents, leaf = path.split(".")
    target = doc
    for name in parents:
        target = target[name]
    del target[leaf]
    return doc


def _with(doc: dict, path: str, value) -> dict:
    doc = json.loads(json.dumps(doc))
    *parents, leaf = path.split(".")
    target = doc
    for name in parents:
        target = target[name]
    target[leaf] = value
    return doc


def _json(doc) -> bytes:
    return json.dumps(doc).encode()


def _padded(doc: dict, size: int) -> bytes:
    """``doc`` as JSON of exactly ``size`` bytes, grown by an unknown (ignored) field."""
    bare = _json({**doc, "padding": ""})
    value = _json({**doc, "padding": "x" * (size - len(bare))})
    assert len(value) == size
    return value


_KEY = object()   # "the order_no of the value", the key a well-behaved producer would use


@dataclass
class Case:
    id: str
    reason: str
    value: bytes | None
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    retriable: str = "false"
    attempts: str = "1"
    decodes: bool = False          # True: the contract accepts it; it fails later, in the pipeline
    after: str | None = None       # produce it after the last good event of this order (same partition)


def bad(id: str, reason: str, value, key=_KEY, **kw) -> Case:
    if key is _KEY:
        order = value.get("order_no") if isinstance(value, dict) else None
        key = order.encode() if isinstance(order, str) else b"ORD-20261129-PPNOKEY"
    if isinstance(value, (dict, list)):
        value = _json(value)
    return Case(id, reason, value, key, **kw)


# Orders whose good events a later bad record contradicts.
MISMATCH_PAID = order_no(prefix="PPMISPAY")
MISMATCH_CREATED = order_no(prefix="PPMISNEW")

_created = _doc()
_paid = _doc("ORDER_PAID")
_cancel = _doc("ORDER_CANCEL")
_shanghai = _doc(data={"amount_cents": 1, "phone": "+8613800000000", "address": "上海市浦东新区"})
_shanghai_bytes = json.dumps(_shanghai, ensure_ascii=False).encode()

CASES: list[Case] = [
    # -- bytes that are not UTF-8 --------------------------------------------------
    bad("not_utf8_invalid_bytes", "not_utf8", b"\xff\xfe not utf-8 at all"),
    bad("not_utf8_truncated_multibyte", "not_utf8", _shanghai_bytes.replace("新区".encode(), "新区".encode()[:-1]),
        key=_shanghai["order_no"].encode()),
    bad("not_utf8_overlong_encoding", "not_utf8", _json(_created).replace(b'"1 Test Road"', b'"\xc0\xaf"')),
    bad("not_utf8_encoded_surrogate", "not_utf8", _json(_created).replace(b'"1 Test Road"', b'"\xed\xa0\x80"')),
    bad("not_utf8_latin1_text", "not_utf8", _json(_created).replace(b'"1 Test Road"', b'"Stra\xdfe 1"')),
    # -- UTF-8, but not JSON -------------------------------------------------------
    bad("utf8_bom_then_json", "not_json", b"\xef\xbb\xbf" + _json(_created)),
    bad("not_json_plain_text", "not_json", b"hello, world"),
    bad("empty_value", "not_json", b""),
    bad("whitespace_only", "not_json", b" \n\t "),
    bad("nan_literal", "not_json", _json(_paid).replace(b'"amount_cents": 12900', b'"amount_cents": NaN')),
    bad("infinity_literal", "not_json", _json(_paid).replace(b'"amount_cents": 12900', b'"amount_cents": Infinity')),
    bad("trailing_comma", "not_json", _json(_created)[:-1] + b",}"),
    bad("two_documents", "not_json", _json(_created) + _json(_created)),
    bad("single_quoted_keys", "not_json", b"{'event_id': 'e1'}"),
    bad("truncated_json", "not_json", _json(_created)[:40]),
    bad("lone_surrogate_escape", "not_json", _json(_created).replace(b'"1 Test Road"', b'"\\ud800"')),
    bad("nested_2000_deep", "not_json", b"[" * 2000 + b"]" * 2000),
    # -- JSON, but not an object ---------------------------------------------------
    bad("json_array", "not_object", b'[{"event_id": "e1"}]'),
    bad("json_number", "not_object", b"42"),
    bad("json_string", "not_object", b'"ORDER_CREATED"'),
    bad("json_null", "not_object", b"null"),
    bad("json_true", "not_object", b"true"),
    # -- no value / too large ------------------------------------------------------
    bad("tombstone", "empty_value", None, key=b"ORD-20261129-PPTOMBSTONE"),
    bad("oversized_1_5_mib", "oversized", _padded(_doc(), MAX_EVENT_BYTES * 3 // 2)),
    bad("oversized_by_one_byte", "oversized", _padded(_doc(), MAX_EVENT_BYTES + 1)),
    # -- required fields missing (absent or null) ----------------------------------
    bad("missing_event_id", "missing_field:event_id", _without(_created, "event_id")),
    bad("null_event_id", "missing_field:event_id", _with(_created, "event_id", None)),
    bad("missing_order_no", "missing_field:order_no", _without(_created, "order_no")),
    bad("missing_type", "missing_field:type", _without(_created, "type")),
    bad("missing_occurred_at", "missing_field:occurred_at", _without(_created, "occurred_at")),
    bad("missing_data", "missing_field:data", _without(_doc("ORDER_CONFIRM"), "data")),
    bad("missing_data_amount_cents", "missing_field:data.amount_cents", _without(_paid, "data.amount_cents")),
    bad("missing_data_phone", "missing_field:data.phone", _without(_created, "data.phone")),
    bad("missing_data_address", "missing_field:data.address", _without(_created, "data.address")),
    bad("missing_data_reason", "missing_field:data.reason", _without(_cancel, "data.reason")),
    bad("null_data_reason", "missing_field:data.reason", _with(_cancel, "data.reason", None)),
    # -- ill-typed or out-of-range fields ------------------------------------------
    bad("event_id_number", "bad_field:event_id", _with(_created, "event_id", 12345)),
    bad("event_id_blank", "bad_field:event_id", _with(_created, "event_id", "   ")),
    bad("event_id_65_chars", "bad_field:event_id", _with(_created, "event_id", "e" * 65)),
    bad("order_no_number", "bad_field:order_no", _with(_created, "order_no", 20261129)),
    bad("order_no_65_chars", "bad_field:order_no", _with(_created, "order_no", "ORD-20261129-" + "A" * 52)),
    bad("type_number", "bad_field:type", _with(_created, "type", 1)),
    bad("data_list", "bad_field:data", _with(_created, "data", [12900, "+8613800000000", "1 Test Road"])),
    bad("data_string", "bad_field:data", _with(_paid, "data", '{"amount_cents": 12900}')),
    bad("amount_string", "bad_field:data.amount_cents", _with(_paid, "data.amount_cents", "12900")),
    bad("amount_float", "bad_field:data.amount_cents", _with(_paid, "data.amount_cents", 129.5)),
    bad("amount_integral_float", "bad_field:data.amount_cents", _with(_paid, "data.amount_cents", 12900.0)),
    bad("amount_bool", "bad_field:data.amount_cents", _with(_paid, "data.amount_cents", True)),
    bad("amount_negative", "bad_field:data.amount_cents", _with(_paid, "data.amount_cents", -1)),
    bad("amount_over_bound", "bad_field:data.amount_cents", _with(_paid, "data.amount_cents", 10**15 + 1)),
    bad("amount_2_pow_64", "bad_field:data.amount_cents", _with(_paid, "data.amount_cents", 2**64)),
    bad("phone_33_chars", "bad_field:data.phone", _with(_created, "data.phone", "1" * 33)),
    bad("phone_blank", "bad_field:data.phone", _with(_created, "data.phone", "")),
    bad("phone_number", "bad_field:data.phone", _with(_created, "data.phone", 8613800000000)),
    bad("address_513_chars", "bad_field:data.address", _with(_created, "data.address", "路" * 513)),
    bad("reason_256_chars", "bad_field:data.reason", _with(_cancel, "data.reason", "r" * 256)),
    # -- unknown type (the worker here is strict: UNHANDLED_EVENT_TYPES=dead_letter) ---
    bad("type_unknown", "unknown_type", _with(_created, "type", "ORDER_SHIPPED")),
    bad("type_lower_case", "lookalike_type", _with(_created, "type", "order_created")),     # never unknown: ours
    # -- a schema version this processor does not read ------------------------------
    bad("schema_version_2", "unsupported_version:2", _with(_created, "schema_version", 2)),
    bad("schema_uri_v3", "unsupported_version:3", _with(_created, "schema_version", "https://schemas.example/v3")),
    # -- order_no format and date --------------------------------------------------
    bad("order_no_free_text", "bad_order_no", _with(_created, "order_no", "12345")),
    bad("order_no_lower_case_prefix", "bad_order_no", _with(_created, "order_no", "ord-20261129-A1")),
    bad("order_no_feb_30", "bad_order_no", _with(_created, "order_no", "ORD-20260230-A1")),
    bad("order_no_month_13", "bad_order_no", _with(_created, "order_no", "ORD-20261301-A1")),
    bad("order_no_feb_29_non_leap", "bad_order_no", _with(_created, "order_no", "ORD-20270229-A1")),
    bad("order_no_suffix_41_chars", "bad_order_no", _with(_created, "order_no", "ORD-20261129-" + "A" * 41)),
    bad("order_no_suffix_punctuation", "bad_order_no", _with(_created, "order_no", "ORD-20261129-A_1")),
    bad("order_no_trailing_newline", "bad_order_no", _with(_created, "order_no", "ORD-20261129-A1\n")),
    # a date past the months t_idem keeps ready: it would sit in p_future, copied by every split
    bad("order_no_far_future", "bad_order_no", _with(_created, "order_no", "ORD-20991231-A1")),
    bad("order_no_fullwidth_digits", "bad_order_no", _with(_created, "order_no", "ORD-\uff12\uff10\uff12\uff16\uff11\uff11\uff12\uff19-X1")),
    # -- occurred_at ---------------------------------------------------------------
    bad("occurred_at_words", "bad_field:occurred_at", _with(_created, "occurred_at", "yesterday")),
    bad("occurred_at_no_offset", "bad_field:occurred_at", _with(_created, "occurred_at", "2026-11-29T10:00:00")),
    bad("occurred_at_date_only", "bad_field:occurred_at", _with(_created, "occurred_at", "2026-11-29")),
    bad("occurred_at_hour_25", "bad_field:occurred_at", _with(_created, "occurred_at", "2026-11-29T25:00:00+08:00")),
    bad("occurred_at_epoch_number", "bad_field:occurred_at", _with(_created, "occurred_at", 1764381600)),
    bad("occurred_at_iso_basic_format", "bad_field:occurred_at", _with(_created, "occurred_at", "20261129T100000+0800")),
    bad("occurred_at_week_date", "bad_field:occurred_at", _with(_created, "occurred_at", "2026-W48-7T10:00:00+08:00")),
    bad("occurred_at_no_seconds", "bad_field:occurred_at", _with(_created, "occurred_at", "2026-11-29T10:00+08:00")),
    bad("occurred_at_offset_hours_only", "bad_field:occurred_at", _with(_created, "occurred_at", "2026-11-29T10:00:00+08")),
    # -- the record key --------------------------------------------------------------
    bad("key_missing", "missing_key", _doc(), key=None),
    bad("key_other_order", "key_mismatch", _doc(), key=b"ORD-20261129-SOMEONEELSE"),
    bad("key_empty", "key_mismatch", _doc(), key=b""),
    bad("key_trailing_newline", "key_mismatch", _created, key=_created["order_no"].encode() + b"\n"),
    bad("key_not_utf8", "key_mismatch", _doc(), key=b"\xff\xfe"),
    # -- a record carrying headers, some of them forged dead-letter headers ----------
    bad("own_and_forged_dlq_headers", "not_json", b"<order>not json</order>",
        headers=(("trace-id", b"4bf92f3577b34da6"), ("dlq.error.type", b"forged"),
                 ("dlq.original.offset", b"-1"), ("content-type", b"application/xml"))),
    # -- valid by the contract, refused by the pipeline ------------------------------
    bad("paid_again_other_amount", "payload_mismatch",
        event(MISMATCH_PAID, "ORDER_PAID", {"amount_cents": 99_900}), decodes=True, after=MISMATCH_PAID),
    bad("created_again_other_address", "payload_mismatch",
        event(MISMATCH_CREATED, "ORDER_CREATED",
              {"amount_cents": 12_900, "phone": "+8613800000000", "address": "2 Other Road"}),
        decodes=True, after=MISMATCH_CREATED),
    bad("paid_for_unknown_order", "precondition_not_met", _doc("ORDER_PAID"), decodes=True,
        retriable="true", attempts=str(1 + len(RETRY_BACKOFF_MS.split(",")))),
]


# Good orders at the edges of the contract: each must be processed, none dead-lettered.
def _edge_orders() -> dict[str, list[dict]]:
    def lifecycle(order: str, created_data: dict | None = None, paid_data: dict | None = None, **fields):
        return [event(order, "ORDER_CREATED", created_data, **fields), event(order, "ORDER_PAID", paid_data, **fields)]

    def longest_id() -> str:
        return uuid.uuid4().hex * 2      # 64 characters, the longest event_id

    edges: dict[str, list[dict]] = {}
    o = order_no(prefix="PPZERO")
    edges[o] = lifecycle(o, {"amount_cents": 0, "phone": "1", "address": "a"}, {"amount_cents": 0})
    o = order_no(prefix="PPMAX")
    edges[o] = lifecycle(o, {"amount_cents": 10**15, "phone": "+" + "9" * 31, "address": "号" * 511 + "🚚"},
                         {"amount_cents": 10**15})
    o = order_no(prefix="PPODD")
    edges[o] = lifecycle(o, {"amount_cents": 7, "phone": "☎ 138-0000", "address": "Zeile 1\u0000\t\"quoted\" \\ 🏠",
                             "unknown": {"nested": [1, 2]}},
                         occurred_at="2026-11-29T02:00:00.123456Z", schema_version="v1")
    for doc in edges[o]:
        doc["event_id"] = longest_id()
    # the last day kept ready (today + PARTITIONS_AHEAD months: a later date is refused), 40-character suffix
    o = f"ORD-{Retention(90).latest():%Y%m%d}-" + "Z" * 31 + uuid.uuid4().hex[:9]
    edges[o] = lifecycle(o)
    o = order_no(prefix="PPREPUB")                                     # re-published CREATED: a duplicate
    edges[o] = lifecycle(o)
    edges[o].insert(1, event(o, "ORDER_CREATED", occurred_at="2026-11-29T10:05:00+08:00"))
    for o in (MISMATCH_PAID, MISMATCH_CREATED):
        edges[o] = lifecycle(o)
    return edges


EXACT_MAX_ORDER = order_no(prefix="PPEXACT")


@dataclass
class Produced:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    case: Case | None = None
    doc: dict | None = None
    timestamp_ms: int = 0
    partition: int = -1
    offset: int = -1


def build_stream(rng: random.Random) -> tuple[list[Produced], dict[str, list[dict]]]:
    """Good events in per-order offset order, randomly interleaved; the bad cases in between."""
    orders = {order_no(prefix="PPGOOD"): [] for _ in range(GOOD_ORDERS)}
    for o in orders:
        orders[o] = [event(o, "ORDER_CREATED"), event(o, "ORDER_PAID")]
    orders.update(_edge_orders())
    exact = event(EXACT_MAX_ORDER, "ORDER_CREATED")
    orders[EXACT_MAX_ORDER] = [exact, event(EXACT_MAX_ORDER, "ORDER_PAID")]

    queues = {o: list(docs) for o, docs in orders.items()}
    good: list[Produced] = []
    while queues:
        o = rng.choice(sorted(queues))
        doc = queues[o].pop(0)
        if not queues[o]:
            del queues[o]
        value = _padded(doc, MAX_EVENT_BYTES) if doc is exact else record(doc)[1]
        good.append(Produced(doc["order_no"].encode(), value, doc=doc))

    last = {p.doc["order_no"]: i for i, p in enumerate(good)}
    slots: dict[int, list[Case]] = {}
    for case in CASES:
        low = last[case.after] + 1 if case.after else 0
        slots.setdefault(rng.randint(low, len(good)), []).append(case)
    stream: list[Produced] = []
    for i in range(len(good) + 1):
        for case in slots.get(i, []):
            stream.append(Produced(case.key, case.value, case.headers, case=case))
        if i < len(good):
            stream.append(good[i])
    return stream, orders


async def produce_each(settings, topic: str, stream: list[Produced]) -> None:
    """Produce in order (idempotent producer: per-partition order holds); note where each record landed."""
    base = int(time.time() * 1000)
    for i, item in enumerate(stream):
        item.timestamp_ms = base + i
    placed = await kafka_ops.produce(settings.kafka.bootstrap, topic,
                                     [(item.key, item.value, list(item.headers) or None) for item in stream],
                                     timestamps=[item.timestamp_ms for item in stream])
    for item, (partition, offset) in zip(stream, placed):
        item.partition, item.offset = partition, offset


# ------------------------------------------------------------------- tests --

def test_corpus_is_large_and_distinct():
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    assert len({(case.key, case.value) for case in CASES}) == len(CASES), "two cases are the same record"
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_decoder_classifies_case(case: Case):
    """The contract alone (no Kafka): the decoder gives the case its reason, or accepts it."""
    try:
        decode(case.key, case.value, max_bytes=MAX_EVENT_BYTES, latest=Retention(90).latest())
    except MalformedEvent as exc:
        assert not case.decodes, f"{case.id}: the pipeline should see this record, decode said {exc.reason}"
        assert exc.reason == case.reason, f"{case.id}: expected {case.reason}, decode said {exc.reason}: {exc}"
    else:
        assert case.decodes, f"{case.id}: decode accepted a record the contract refuses ({case.reason})"


def _headers(record) -> tuple[dict[str, str], list[str]]:
    """The dlq.* headers as text, and the names of any that occur more than once."""
    ours: dict[str, str] = {}
    twice: list[str] = []
    for name, value in record.headers or ():
        if name.startswith("dlq."):
            if name in ours:
                twice.append(name)
            ours[name] = value.decode("utf-8", errors="replace")
    return ours, twice


def _short(data: bytes | None) -> str:
    return repr(data) if data is None or len(data) <= 60 else f"{data[:60]!r}... ({len(data)} bytes)"


def test_poison_pills_are_dead_lettered_once_and_good_events_done(settings, topics, spawn_worker, scratch_db):
    started = time.monotonic()
    pair = topics(partitions=3)
    worker = spawn_worker(pair, MAX_EVENT_BYTES=str(MAX_EVENT_BYTES), RETRY_BACKOFF_MS=RETRY_BACKOFF_MS,
                          UNHANDLED_EVENT_TYPES="dead_letter",
                          DLQ_TRUNCATE_BYTES=str(DLQ_TRUNCATE_BYTES),
                          COMPENSATOR_ENABLED="false")   # the ledger rows as dead-lettered, not yet worked
    stream, orders = build_stream(random.Random(SEED))
    asyncio.run(produce_each(settings, pair.events, stream))
    bad_items = [p for p in stream if p.case is not None]
    good_items = [p for p in stream if p.case is None]
    assert len({p.partition for p in bad_items}) == pair.partitions, "bad records should span every partition"

    wait_for(lambda: services.caught_up(settings, pair.events, pair.group, pair.partitions), timeout=240,
             interval=1.0, what="every record processed and committed", workers=[worker])

    problems: list[str] = []
    by_source = {(p.partition, p.offset): p for p in stream}

    # -- the dead-letter topic ------------------------------------------------------------
    total = sum(asyncio.run(end_offsets(settings, pair.dlq, pair.dlq_partitions)).values())
    letters = asyncio.run(consume_all(settings, pair.dlq, expect=total, timeout=60))
    if len(letters) != total:
        problems.append(f"read {len(letters)} of the {total} records on the dead-letter topic")
    seen: dict[int, list] = {}
    for letter in letters:
        h, twice = _headers(letter)
        try:
            source = (int(h["dlq.original.partition"]), int(h["dlq.original.offset"]))
        except (KeyError, ValueError):
            problems.append(f"dead letter {letter.partition}@{letter.offset} has no usable origin headers: {h}")
            continue
        item = by_source.get(source) if h.get("dlq.original.topic") == pair.events else None
        if item is None:
            problems.append(f"dead letter {letter.partition}@{letter.offset} points at no produced record: {h}")
        elif item.case is None:
            problems.append(f"good event {item.doc['type']} of {item.doc['order_no']} ({source}) was dead-lettered "
                            f"as {h.get('dlq.error.type')}: {h.get('dlq.error.message')}")
        else:
            seen.setdefault(id(item), []).append((letter, h, twice))

    for item in bad_items:
        case, where = item.case, f"[{item.case.id}] (partition {item.partition}, offset {item.offset})"
        found = seen.get(id(item), [])
        if len(found) != 1:
            problems.append(f"{where}: on the dead-letter topic {len(found)} times, expected once")
            if not found:
                continue
        letter, h, twice = found[0]
        expected = {
            "dlq.error.type": case.reason, "dlq.original.topic": pair.events,
            "dlq.original.partition": str(item.partition), "dlq.original.offset": str(item.offset),
            "dlq.original.timestamp": str(item.timestamp_ms), "dlq.consumer.group": pair.group,
            "dlq.retriable": case.retriable, "dlq.attempts": case.attempts,
            "dlq.worker.id": worker.env["WORKER_ID"],
        }
        for name, want in expected.items():
            if h.get(name) != want:
                problems.append(f"{where}: header {name} is {h.get(name)!r}, expected {want!r}"
                                + (f" (message: {h.get('dlq.error.message')})" if name == "dlq.error.type" else ""))
        if not h.get("dlq.error.message"):
            problems.append(f"{where}: dlq.error.message is empty")
        try:
            datetime.fromisoformat(h.get("dlq.first.failure", ""))
        except ValueError:
            problems.append(f"{where}: dlq.first.failure {h.get('dlq.first.failure')!r} is not a timestamp")
        if twice:
            problems.append(f"{where}: headers {twice} occur more than once")
        own = [(k, v) for k, v in case.headers if not k.startswith("dlq.")]
        got_own = [(k, v) for k, v in letter.headers or () if not k.startswith("dlq.")]
        if got_own != own:
            problems.append(f"{where}: the record's own headers are {got_own}, expected {own}")
        if letter.key != item.key:
            problems.append(f"{where}: key {_short(letter.key)} differs from the produced {_short(item.key)}")
        value = item.value
        if case.reason == "oversized":          # goes out as its first DLQ_TRUNCATE_BYTES, described in headers
            value = item.value[:DLQ_TRUNCATE_BYTES]
            described = {"dlq.truncated": "value", "dlq.original.value.bytes": str(len(item.value)),
                         "dlq.original.value.sha256": hashlib.sha256(item.value).hexdigest()}
            if {name: h.get(name) for name in described} != described:
                problems.append(f"{where}: truncation headers { {n: h.get(n) for n in described} }")
        elif "dlq.truncated" in h:
            problems.append(f"{where}: truncated ({h['dlq.truncated']}) although it fits")
        if letter.value != value:
            problems.append(f"{where}: value {_short(letter.value)} differs from the produced {_short(value)}")

    # -- the compensation ledger ------------------------------------------------------------
    rows = scratch_db.query("SELECT src_partition, src_offset, consumer_group, status, reason, retriable, attempts, "
                            "truncated FROM t_compensation WHERE src_topic = %s", pair.events)
    ledger: dict[tuple[int, int], list[dict]] = {}
    for row in rows:
        ledger.setdefault((row["src_partition"], row["src_offset"]), []).append(row)
    for source, found in ledger.items():
        item = by_source.get(source)
        if item is None or item.case is None:
            what = "no produced record" if item is None else f"good event {item.doc['type']} of {item.doc['order_no']}"
            problems.append(f"t_compensation row {source} is for {what}: {found}")
    for item in bad_items:
        case, where = item.case, f"[{item.case.id}] (partition {item.partition}, offset {item.offset})"
        found = ledger.get((item.partition, item.offset), [])
        if len(found) != 1:
            problems.append(f"{where}: {len(found)} t_compensation rows, expected 1")
            if not found:
                continue
        row = found[0]
        want = {"status": 1 if case.retriable == "true" else 4, "reason": case.reason, "consumer_group": pair.group,
                "retriable": int(case.retriable == "true"), "attempts": int(case.attempts),
                "truncated": int(case.reason == "oversized")}
        got = {name: row[name] for name in want}
        if got != want:
            problems.append(f"{where}: t_compensation row {got}, expected {want}")

    # -- the good events ------------------------------------------------------------------
    keys = {step_keys(decode(p.key, p.value, max_bytes=MAX_EVENT_BYTES))[0]: p for p in good_items}
    marks = ", ".join(["%s"] * len(keys))
    done = {row["biz_key"]: row["status"] for row in scratch_db.query(
        f"SELECT biz_key, status FROM t_idem WHERE biz_key IN ({marks})", *keys)}
    for key, item in keys.items():
        if done.get(key) != IdemStatus.DONE:
            problems.append(f"good event {item.doc['type']} of {item.doc['order_no']} (partition {item.partition}, "
                            f"offset {item.offset}): t_idem {key} status {done.get(key)}, expected done")
    order_marks = ", ".join(["%s"] * len(orders))
    stored = {row["order_no"]: row for row in scratch_db.query(
        f"SELECT order_no, status, amount_cents, address, paid_cents FROM t_order WHERE order_no IN ({order_marks})",
        *orders)}
    for o, docs in orders.items():
        created = next(d for d in docs if d["type"] == "ORDER_CREATED")["data"]
        paid = next(d for d in docs if d["type"] == "ORDER_PAID")["data"]
        want = {"status": OrderStatus.PAID, "amount_cents": created["amount_cents"], "address": created["address"],
                "paid_cents": paid["amount_cents"]}
        row = stored.get(o)
        got = None if row is None else {name: row[name] for name in want}
        if got != want:
            problems.append(f"order {o}: t_order {str(got)[:200]}, expected {str(want)[:200]}")

    # -- the worker -----------------------------------------------------------------------
    if not worker.alive:
        problems.append(f"the worker exited ({worker.proc.returncode})")
    log_text = worker.logs()
    for needle in ("phase 1 failed", "internal error on", "stopping the worker without committing"):
        if needle in log_text:
            problems.append(f"the worker log says {needle!r}")

    elapsed = time.monotonic() - started
    assert not problems, (
        f"{len(problems)} problem(s) with {len(bad_items)} bad records among {len(good_items)} good events "
        f"({elapsed:.0f}s); worker log {worker.log_path}:\n  " + "\n  ".join(problems))
