"""What goes on the dead-letter topic for records that cannot go as they are."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from datetime import UTC, datetime

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import given, settings
from hypothesis import strategies as st

from app.adapters.kafka.dlq import KafkaDeadLetterSink, outgoing
from app.adapters.kafka.topics import DLQ_MAX_MESSAGE_BYTES
from app.pipeline.ports import DeadLetter, SourceRecord

N = 1024


def letter(key, value, headers=(), reason="not_json") -> DeadLetter:
    return DeadLetter(record=SourceRecord("order-event", 2, 41, 1_764_000_000_000, key, value, tuple(headers)),
                      reason=reason, message="m", retriable=False, attempts=1,
                      first_failure_at=datetime(2026, 11, 29, tzinfo=UTC))


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


def size(out) -> int:
    return DefaultRecordBatchBuilder.estimate_size_in_bytes(out.key, out.value, out.headers)


def test_a_record_too_big_for_the_topic_is_cut_whatever_its_reason():
    key = b"K" * 5000
    headers = [(f"h{i}", b"x" * 100) for i in range(20)]
    whole = outgoing(letter(key, b"v" * 5000, headers, reason="key_mismatch"), "g", truncate_bytes=N)
    assert not whole.truncated and len(whole.key) == 5000           # it fits: it goes as it is
    out = outgoing(letter(key, b"v" * 5000, headers, reason="key_mismatch"), "g", truncate_bytes=N, max_bytes=3000)
    h = ours(out)
    assert h["truncated"] == "value,key,headers" and out.truncated and size(out) <= 3000
    assert (len(out.key), len(out.value)) == (N, N)
    assert not [k for k, _ in out.headers if not k.startswith("dlq.")]
    assert (h["original.headers.count"], h["original.key.bytes"]) == ("20", "5000")
    # only as much as needed: here the value alone
    out = outgoing(letter(key, b"v" * 5000, headers, reason="key_mismatch"), "g", truncate_bytes=N, max_bytes=9000)
    assert ours(out)["truncated"] == "value" and len(out.key) == 5000 and size(out) <= 9000


def test_megabytes_of_raw_header_keys_fit_the_topic_without_their_json_copy():
    """5 MiB of headers whose keys are not UTF-8: escaped on the record, and a JSON copy of them
    in base64 came to a 12 MiB dead letter against the topic's 9 MiB; the send failed, the worker
    stopped, for ever. The copy goes (described by size and digest); the headers stay."""
    raw = [("\udcff" + "k" * 40 + str(i), b"v" * 100_000) for i in range(50)]
    out = outgoing(letter(b"k", b"v", raw, reason="header_not_utf8"), "g", truncate_bytes=64 * 1024)
    h = ours(out)
    assert size(out) <= DLQ_MAX_MESSAGE_BYTES and "original.headers" not in h
    assert h["original.headers.count"] == "50" and len(h["original.headers.sha256"]) == 64
    assert len([k for k, _ in out.headers if not k.startswith("dlq.")]) == 50 and not out.truncated


@given(st.integers(0, 6000), st.integers(0, 6000), st.lists(st.tuples(st.text(max_size=30), st.binary(max_size=800)),
                                                            max_size=12), st.sampled_from(["not_json", "oversized"]))
@settings(max_examples=300, deadline=None)
def test_whatever_the_record_what_is_sent_fits_the_topic(key_bytes, value_bytes, headers, reason):
    out = outgoing(letter(b"k" * key_bytes, b"v" * value_bytes, headers, reason=reason), "g", truncate_bytes=N,
                   max_bytes=4000)
    assert size(out) <= 4000


def test_header_keys_that_are_not_utf8_are_escaped_and_kept_exactly():
    raw = "\udcff\udcfebad"                          # b"\xff\xfebad" as the consumer hands it over
    out = outgoing(letter(b"k", b"v", [(raw, b"1"), ("ok", None)], reason="header_not_utf8"), "g", truncate_bytes=N)
    assert out.headers[:2] == [("\\xff\\xfebad", b"1"), ("ok", None)]
    for name, _ in out.headers:
        name.encode("utf-8")                         # every key can be sent, and read back by any client
    original = json.loads(ours(out)["original.headers"])
    assert [[base64.b64decode(k), v and base64.b64decode(v)] for k, v in original] == [
        [b"\xff\xfebad", b"1"], [b"ok", None]]


class MetadataLater:
    """A producer whose brokers give the topic's metadata only at the third ask (they restart)."""

    def __init__(self) -> None:
        self.asks = 0

    async def send(self, topic, *, value, key, headers):
        from aiokafka.errors import UnknownTopicOrPartitionError

        self.asks += 1
        if self.asks < 3:
            raise UnknownTopicOrPartitionError()
        acked = asyncio.get_running_loop().create_future()
        acked.set_result(None)
        return acked


async def test_a_dead_letter_whose_topic_metadata_comes_late_is_sent_within_its_bound():
    sink = KafkaDeadLetterSink("127.0.0.1:1", "order-event-dlq", "g", timeout_seconds=30)
    sink._producer = producer = MetadataLater()
    await sink.publish([letter(b"k", b"v")])
    assert producer.asks == 3


async def test_a_dead_letter_topic_that_never_comes_fails_at_the_bound():
    sink = KafkaDeadLetterSink("127.0.0.1:1", "order-event-dlq", "g", timeout_seconds=1.2)
    sink._producer = producer = MetadataLater()
    producer.asks = -10**9                       # never
    with pytest.raises(asyncio.TimeoutError):
        await sink.publish([letter(b"k", b"v")])
