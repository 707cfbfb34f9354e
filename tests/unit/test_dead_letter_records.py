"""What goes on the dead-letter topic for records that cannot go as they are."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import datetime, timezone

from app.adapters.kafka_dlq import outgoing
from app.pipeline.ports import DeadLetter, SourceRecord

N = 1024


def letter(key, value, headers=(), reason="not_json") -> DeadLetter:
    return DeadLetter(record=SourceRecord("order-event", 2, 41, 1_764_000_000_000, key, value, tuple(headers)),
                      reason=reason, message="m", retriable=False, attempts=1,
                      first_failure_at=datetime(2026, 11, 29, tzinfo=timezone.utc))


def ours(out) -> dict[str, str]:
    return {k[4:]: v.decode() for k, v in out.headers if k.startswith("dlq.")}


def test_an_ordinary_record_goes_byte_for_byte():
    out = outgoing(letter(b"k", b"{bad", [("trace", b"1"), ("dlq.error.type", b"forged")]), "g", truncate_bytes=N)
    assert (out.key, out.value, out.truncated) == (b"k", b"{bad", False)
    assert out.headers[0] == ("trace", b"1") and ours(out)["error.type"] == "not_json"
    assert [k for k, _ in out.headers].count("dlq.error.type") == 1
    assert "truncated" not in ours(out) and "placeholder" not in ours(out)


def test_neither_key_nor_value_gets_a_placeholder_value_and_says_so():
    out = outgoing(letter(None, None, reason="empty_value"), "g", truncate_bytes=N)
    assert (out.key, out.value) == (None, b"") and ours(out)["placeholder"] == "value"


def test_a_tombstone_with_a_key_goes_as_it_is():
    out = outgoing(letter(b"ORD-1", None, reason="empty_value"), "g", truncate_bytes=N)
    assert (out.key, out.value) == (b"ORD-1", None) and "placeholder" not in ours(out)


def test_an_oversized_value_is_cut_with_its_size_and_digest():
    value = bytes(range(256)) * 100
    out = outgoing(letter(b"k", value, reason="oversized"), "g", truncate_bytes=N)
    assert out.value == value[:N] and out.key == b"k" and out.truncated
    h = ours(out)
    assert (h["truncated"], h["original.value.bytes"]) == ("value", str(len(value)))
    assert h["original.value.sha256"] == hashlib.sha256(value).hexdigest()


def test_a_record_too_big_for_the_topic_is_cut_whatever_its_reason():
    key = b"K" * 5000
    headers = [("h%d" % i, b"x" * 100) for i in range(20)]
    out = outgoing(letter(key, b"v" * 5000, headers, reason="key_mismatch"), "g", truncate_bytes=N, max_bytes=70_000)
    h = ours(out)
    assert h["truncated"] == "value,key,headers" and out.truncated
    assert (len(out.key), len(out.value)) == (N, N)
    assert not [k for k, _ in out.headers if not k.startswith("dlq.")]
    assert (h["original.headers.count"], h["original.key.bytes"]) == ("20", "5000")


def test_header_keys_that_are_not_utf8_are_escaped_and_kept_exactly():
    raw = "\udcff\udcfebad"                          # b"\xff\xfebad" as the consumer hands it over
    out = outgoing(letter(b"k", b"v", [(raw, b"1"), ("ok", None)], reason="header_not_utf8"), "g", truncate_bytes=N)
    assert out.headers[:2] == [("\\xff\\xfebad", b"1"), ("ok", None)]
    for name, _ in out.headers:
        name.encode("utf-8")                         # every key can be sent, and read back by any client
    original = json.loads(ours(out)["original.headers"])
    assert [[base64.b64decode(k), v and base64.b64decode(v)] for k, v in original] == [
        [b"\xff\xfebad", b"1"], [b"ok", None]]
