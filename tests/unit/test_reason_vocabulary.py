"""Every label value that comes from a record is from a closed set: a dead letter's reason as a label
is one of a vocabulary known in advance (the detail a record chose, a version, stays in the letter), and
the error groups of letters whose versions, types or keys a producer chose are a bounded few."""

from __future__ import annotations

import json
import random
import re
import string
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from app.compensation.fingerprints import fingerprint, shape
from app.pipeline.envelopes import Reading
from app.pipeline.errors import MalformedEvent
from app.pipeline.events import decode
from app.pipeline.reasons import OTHER, VOCABULARY, kind_of, label_of

ROOT = Path(__file__).resolve().parents[2]
ORDER = "ORD-20260915-88231"
DOC = {"event_id": "e-1", "order_no": ORDER, "type": "ORDER_CREATED", "occurred_at": "2026-09-15T10:00:00Z",
       "data": {"amount_cents": 1, "phone": "+1", "address": "a"}}
rng = random.Random(20261208)


def noise(n: int = 16) -> str:
    return "".join(rng.choice(string.printable) for _ in range(n))


def reason_and_message(value: bytes, key: bytes = ORDER.encode(), headers=()) -> tuple[str, str]:
    try:
        decode(key, value, max_bytes=1 << 20, headers=headers, reading=Reading())
    except MalformedEvent as exc:
        return exc.reason, str(exc)
    raise AssertionError("decoded")


def test_a_detail_the_record_chose_is_not_part_of_the_label_or_the_group_key():
    assert kind_of("unsupported_version:2") == label_of("unsupported_version:x_9-.z") == "unsupported_version"
    assert label_of("missing_field:data.phone") == "missing_field:data.phone"
    assert label_of("missing_field:data.whatever") == OTHER and label_of("made_up") == OTHER
    assert kind_of("missing_field:data.phone") == "missing_field:data.phone"


def test_every_reason_the_docs_list_for_dead_letters_is_in_the_vocabulary():
    page = (ROOT / "docs" / "exactly-once.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `dlq.error.type` |"))
    listed = {r.replace("<f>", "data.phone").replace("<v>", "2") for r in re.findall(r"`([a-z0-9_:<>.]+)`", row)}
    listed.discard("dlq.error.type")
    assert len(listed) > 30
    assert sorted(r for r in listed if label_of(r) == OTHER) == []


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(["event_id", "order_no", "type", "occurred_at", "data", "schema_version"]),
                       st.one_of(st.none(), st.integers(), st.text(max_size=20), st.booleans(),
                                 st.dictionaries(st.sampled_from(["amount_cents", "phone", "address", "reason"]),
                                                 st.one_of(st.integers(), st.text(max_size=5), st.none())))),
       st.binary(max_size=12))
def test_whatever_a_record_holds_its_reason_is_a_label_of_the_vocabulary(fields, key):
    doc = {**DOC, **fields}
    try:
        decode(key or None, json.dumps(doc).encode(), max_bytes=1 << 20, reading=Reading())
    except MalformedEvent as exc:
        assert label_of(exc.reason) in VOCABULARY, exc.reason
        assert label_of(exc.reason) != OTHER, exc.reason


def test_a_thousand_random_versions_make_one_error_group_per_type():
    groups = set()
    for _ in range(1000):
        version = rng.choice([noise(), str(rng.randint(2, 10**9)), f"https://s.example/{noise(8)}/v{noise(3)}",
                              "': x for y:' HTTP 503 XyzError", 'a"b\'c\\'])
        doc = {**DOC, "type": rng.choice(["ORDER_CREATED", "ORDER_PAID"]), "schema_version": version}
        reason, message = reason_and_message(json.dumps(doc).encode())
        assert reason.startswith("unsupported_version:") and label_of(reason) == "unsupported_version"
        groups.add(fingerprint(reason, message))
        assert shape(reason, message).effect == "-" and shape(reason, message).detail == "-"
    assert len(groups) == 2


def test_random_lookalike_types_and_keys_make_a_bounded_few_groups():
    groups = set()
    for _ in range(1000):
        type_ = rng.choice(["ORDER_PAID", "ORDER_CONFIRM"]) + rng.choice(["_", ".", "-"]) + noise(6)
        reason, message = reason_and_message(json.dumps({**DOC, "type": type_}).encode())
        groups.add(fingerprint(reason, message))
        key = ('"' + noise(10) + '"' + noise(5)).encode()
        reason, message = reason_and_message(json.dumps(DOC).encode(), key=key)
        assert reason == "key_mismatch"
        groups.add(fingerprint(reason, message))
    assert len(groups) <= 2 * 2 + 1, len(groups)
