"""Record batches aiokafka alone cannot read: the guard reads them, or stands a placeholder in,
and never raises. Batches are built with aiokafka's own builder, then broken by hand the
way other clients (librdkafka's raw header keys) or attackers (decompression bombs) do."""

from __future__ import annotations

import struct

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c

from app.adapters.kafka.records import GuardedRecords, unreadable

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
LIMIT = 1 << 20


def batch(records, codec: int = 0, base_offset: int = 100) -> bytes:
    builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 64 << 20)
    for delta, (key, value, headers) in enumerate(records):
        builder.append(delta, 1_000 + delta, key, value, headers)
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, base_offset)
    return bytes(raw)


def with_crc(raw: bytes) -> bytes:
    """Recompute the CRC after editing a batch (it covers attributes to the end)."""
    raw = bytearray(raw)
    struct.pack_into(">I", raw, 17, calc_crc32c(bytes(raw[21:])))
    return bytes(raw)


def read(data: bytes, limit: int = LIMIT) -> list:
    GuardedRecords.max_batch_bytes = limit
    records = GuardedRecords(data)
    out = []
    while records.has_next():
        b = records.next_batch()
        assert b.validate_crc()
        out.extend(b)
    return out


def plain(data: bytes) -> list:
    records = MemoryRecords(data)
    out = []
    while records.has_next():
        out.extend(records.next_batch())
    return out


ROWS = [(b"k1", b"v1", [("trace", b"t1")]), (None, b"v2", []), (b"k3", None, [("n", None)])]


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_reads_the_same_records_as_aiokafka(codec):
    data = batch(ROWS, CODECS[codec]) + batch(ROWS, CODECS[codec], base_offset=103)
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in read(data)]
    want = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in plain(data)]
    assert got == want and [g[0] for g in got] == [100, 101, 102, 103, 104, 105]


def header_key_not_utf8(codec: int) -> bytes:
    """A batch whose second record has the header key b'\\xff\\xfebad', as kcat writes it."""
    rows = [(b"k1", b"v1", []), (b"k2", b"v2", [("AAbad", b"1"), ("ok", b"2")]), (b"k3", b"v3", [])]
    raw = batch(rows)                                   # uncompressed: the key bytes are there to edit
    raw = raw.replace(b"AAbad", b"\xff\xfebad")
    if codec:
        # recompress the edited records with aiokafka's codec, as a producer would have
        from aiokafka.codec import gzip_encode, lz4_encode, snappy_encode, zstd_encode
        encode = {1: gzip_encode, 2: snappy_encode, 3: lz4_encode, 4: zstd_encode}[codec]
        body = encode(raw[61:])
        header = bytearray(raw[:61])
        struct.pack_into(">i", header, 8, 49 + len(body))
        attrs, = struct.unpack_from(">h", header, 21)
        struct.pack_into(">h", header, 21, attrs | codec)
        raw = bytes(header) + body
    return with_crc(raw)


@pytest.mark.parametrize("codec", CODECS)
def test_a_header_key_that_is_not_utf8_is_kept_byte_for_byte(codec):
    data = header_key_not_utf8(CODECS[codec])
    with pytest.raises(UnicodeDecodeError):
        plain(data)                                    # what aiokafka alone does: the fetch dies
    got = read(data)
    assert [(r.offset, r.key, r.value) for r in got] == [(100, b"k1", b"v1"), (101, b"k2", b"v2"),
                                                         (102, b"k3", b"v3")]
    [(name, value), second] = got[1].headers
    assert name.encode("utf-8", "surrogateescape") == b"\xff\xfebad" and value == b"1"
    assert second == ("ok", b"2")
    assert all(unreadable(r.headers) is None for r in got)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_decompression_bomb_is_never_inflated_past_the_bound(codec):
    bomb = batch([(b"ORD-20261129-B1", bytes(8 << 20), [])], CODECS[codec])
    assert len(bomb) < 1 << 20                         # it passes a broker that counts compressed bytes
    [placeholder] = read(bomb + batch(ROWS, base_offset=101), limit=LIMIT)[:1]
    problem = unreadable(placeholder.headers)
    assert problem.reason == "oversized" and "decompresses to more than 1048576 bytes" in problem.message
    assert placeholder.offset == 100 and placeholder.value == bomb and placeholder.key is None
    rest = read(bomb + batch(ROWS, base_offset=101), limit=LIMIT)[1:]
    assert [r.offset for r in rest] == [101, 102, 103]   # the batches after it are read as usual


def test_a_batch_just_under_the_bound_is_read_and_one_over_is_not():
    body = 200_000
    data = batch([(b"k", bytes(body), [])], CODECS["gzip"])
    size = len(plain(data)[0].value)
    uncompressed = len(batch([(b"k", bytes(body), [])])) - 61
    assert read(data, limit=uncompressed)[0].value == bytes(size)
    assert unreadable(read(data, limit=uncompressed - 1)[0].headers).reason == "oversized"


def test_a_record_that_even_the_tolerant_parser_cannot_read_becomes_a_placeholder():
    raw = bytearray(batch(ROWS))
    raw[61] = 0x7F                                     # the first record's length varint, far too big
    got = read(with_crc(bytes(raw)))
    assert [r.offset for r in got] == [100, 101, 102]
    assert {unreadable(r.headers).reason for r in got} == {"unreadable_record"}


def test_corrupt_compressed_data_becomes_placeholders():
    raw = bytearray(batch(ROWS, CODECS["gzip"]))
    raw[70:80] = b"\x00" * 10
    got = read(with_crc(bytes(raw)))
    assert [r.offset for r in got] == [100, 101, 102]
    assert "cannot be decompressed" in unreadable(got[0].headers).message


def test_a_guarded_batch_is_an_iterator_too():
    """Under read_committed, aiokafka reads a control batch's marker with ``next(batch)``."""
    GuardedRecords.max_batch_bytes = LIMIT
    for codec in (0, 1):
        first = GuardedRecords(batch(ROWS, codec)).next_batch()
        assert next(first).key == b"k1" and next(first).value == b"v2"


def test_the_raw_batch_is_kept_once_for_a_run_of_placeholders():
    """2,000 records of a batch over the bound: one copy of the raw batch (the first offset's
    value), the others empty and pointing to it."""
    bomb = batch([(b"k%d" % i, bytes(30_000), []) for i in range(2000)], CODECS["gzip"])
    got = read(bomb, limit=LIMIT)
    assert [r.offset for r in got] == list(range(100, 2100))
    assert got[0].value == bomb and {r.value for r in got[1:]} == {b""}
    runs = {(p.reason, p.first, p.last) for p in (unreadable(r.headers) for r in got)}
    assert runs == {("oversized", 100, 2099)}


@pytest.mark.parametrize("size", [0, -4, -100, 1 << 30])
def test_a_snappy_frame_whose_block_size_lies_is_unreadable_not_a_hang(size):
    """The xerial framing's block size comes from the record: 0 or less looped for ever."""
    import signal

    frame = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", size) + b"\x00" * 16
    raw = bytearray(batch(ROWS, CODECS["snappy"])[:61] + frame)      # a snappy batch's header, this body
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    class Looped(BaseException):          # the guard turns any Exception into a placeholder
        pass

    def looped(*_):
        raise Looped("the snappy reader looped")

    previous = signal.signal(signal.SIGALRM, looped)
    signal.alarm(5)
    try:
        got = read(with_crc(bytes(raw)))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert {unreadable(r.headers).reason for r in got} == {"unreadable_record"}


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_corrupt_data_is_told_from_a_bomb_in_every_codec(codec):
    """Overflow is told from cramjam's message; a change of it would make every bomb 'corrupt'
    (or every corrupt batch 'oversized'): checked for each codec."""
    raw = bytearray(batch(ROWS * 50, CODECS[codec]))
    raw[61:71] = b"\xff" * 10                                # the compressed stream's first bytes
    got = read(with_crc(bytes(raw)))
    assert {unreadable(r.headers).reason for r in got} == {"unreadable_record"}
    assert "cannot be decompressed" in unreadable(got[0].headers).message
    bomb = batch([(b"k", bytes(4 << 20), [])], CODECS[codec])
    assert unreadable(read(bomb, limit=LIMIT)[0].headers).reason == "oversized"
