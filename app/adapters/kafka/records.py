"""Record batches that aiokafka 0.14 cannot read safely on its own, read safely.

Three kinds of record stop a consumer built on aiokafka: its record parser
raises inside ``getmany()``, Faust's fetcher dies, the worker restarts and
fetches the same record again, for ever.

* A header key that is not UTF-8 (librdkafka writes header keys as raw bytes,
  ``kcat -H``): the parser decodes every key with ``bytes.decode("utf-8")``.
* A compressed batch is decompressed whole, with no bound: 1 GiB of zeros
  gzips to about 1 MiB, passes the broker's ``max.message.bytes`` (which
  counts compressed bytes) and becomes 1 GiB, then a second copy, in the worker.
* A batch that is corrupt in a way its CRC does not catch, or compressed with
  a codec whose library is missing.

The fetcher's ``MemoryRecords`` is replaced (by ``app.adapters.kafka.upstream``) with
:class:`GuardedRecords`, which hands aiokafka the same batches wrapped so
that iterating one never raises:

* a compressed v2 batch is decompressed here first, into a buffer of at most
  ``max_batch_bytes`` (cramjam's ``decompress_into`` stops when the buffer is
  full); then aiokafka's C parser reads the batch rebuilt uncompressed. A batch
  that does not fit is never inflated: each of its offsets becomes a
  placeholder record (reason ``oversized``) whose value is the raw batch;
* if the C parser raises part way, the rest of the batch is read by the small
  tolerant parser below, which keeps header keys as ``str`` with the bytes that
  are not UTF-8 escaped (``surrogateescape``: ``key.encode("utf-8",
  "surrogateescape")`` gives the original bytes back); what even that cannot
  read becomes placeholders (reason ``unreadable_record``).

Placeholders carry one header whose key is an :class:`Unreadable` (a ``str``
subclass no client can produce); :func:`unreadable` finds it. The raw batch is
kept once, as the value of the first placeholder of the run; the others carry
an empty value and point to it (a batch of 200,000 records is one copy, not
200,000). Downstream they are dead letters like any malformed record, one letter
per run and batch (``app.pipeline.batch``). Legacy (v0/v1) batches are left to
aiokafka: Kafka 4 no longer accepts them from producers.

What an upstream fix would be: in aiokafka's ``DefaultRecordBatch``, a
``max_decompressed_bytes`` option that decompresses into a bounded buffer and
raises a typed ``RecordTooLargeError`` carrying the batch's offsets, and header
keys decoded with ``surrogateescape`` (or exposed as bytes); in its fetcher, a
per-batch error handler, so that one unreadable batch is reported instead of
failing the whole fetch. Kafka's Java consumer has the same hole for the
first point (it throws on a corrupt record and leaves the offset where it is).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator

import cramjam
from aiokafka.record.default_records import DefaultRecordBatch
from aiokafka.record.memory_records import MemoryRecords as _CMemoryRecords
from aiokafka.record.util import decode_varint

from app.pipeline.ports import SourceRecord, UnreadableRun

log = logging.getLogger(__name__)

LOG_OVERHEAD = 12               # base offset (8) + batch length (4)
RECORDS_OFFSET = 61             # where the records start in a v2 batch
ATTRIBUTES_OFFSET = 21
CODEC_MASK = 0x07
LOG_APPEND_TIME = 0x08
CODECS = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_XERIAL = b"\x82SNAPPY\x00"


class Unreadable(str):
    """The key of the one header of a placeholder record: why the record could not be read, and
    the offsets of the run of placeholders it belongs to."""

    __slots__ = ("reason", "first", "last")

    def __new__(cls, reason: str, first: int, last: int) -> Unreadable:
        marker = super().__new__(cls, "x-unreadable-record")
        marker.reason, marker.first, marker.last = reason, first, last
        return marker


def unreadable(headers) -> UnreadableRun | None:
    """What a placeholder stands for if ``headers`` are a placeholder's, else None."""
    if headers and type(headers[0][0]) is Unreadable:
        key, message = headers[0]
        return UnreadableRun(key.reason, message.decode(), key.first, key.last)
    return None


def source_record(message) -> SourceRecord:
    """A consumed record (Faust's ``event.message``) as the pipeline sees it, placeholders included."""
    # Faust hands the timestamp over in seconds (a float); Kafka has it in milliseconds.
    timestamp = None if message.timestamp is None else round(message.timestamp * 1000)
    if not message.headers:              # the usual record: no header, so no placeholder either
        return SourceRecord(message.topic, message.partition, message.offset, timestamp, message.key, message.value)
    headers = tuple(message.headers)
    problem = unreadable(headers)
    return SourceRecord(message.topic, message.partition, message.offset, timestamp, message.key, message.value,
                        () if problem else headers, problem)


class TooLarge(Exception):
    """A batch decompresses to more than the bound."""


def configure(max_batch_bytes: int) -> None:
    """The bound on a decompressed batch (``settings.batches.max_batch_bytes``) for every
    :class:`GuardedRecords` of this process."""
    GuardedRecords.max_batch_bytes = max_batch_bytes


class GuardedRecords:
    """aiokafka's ``MemoryRecords``, handing out :class:`GuardedBatch` es."""

    __slots__ = ("_data", "_inner", "_pos")
    max_batch_bytes = 64 * 1024 * 1024

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._inner = _CMemoryRecords(data)
        self._pos = 0

    def size_in_bytes(self) -> int:
        return self._inner.size_in_bytes()

    def has_next(self) -> bool:
        return self._inner.has_next()

    def next_batch(self):
        start = self._pos
        batch = self._inner.next_batch()
        if batch is None:
            return None
        (length,) = struct.unpack_from(">i", self._data, start + 8)
        self._pos = start + LOG_OVERHEAD + length
        if batch.magic < 2:
            return batch
        return GuardedBatch(batch, memoryview(self._data)[start:self._pos], self.max_batch_bytes)


class GuardedBatch:
    """A v2 record batch whose iteration yields records or placeholders, and never raises.

    Like aiokafka's own batch it is also an iterator: under ``read_committed`` the fetcher
    reads a control batch's marker with ``next(batch)`` (``_contains_abort_marker``)."""

    __slots__ = ("_batch", "_raw", "_limit", "_records")

    def __init__(self, batch, raw: memoryview, limit: int) -> None:
        self._batch = batch
        self._raw = raw
        self._limit = limit
        self._records: Iterator | None = None

    def __next__(self):
        if self._records is None:
            self._records = iter(self)
        return next(self._records)

    def __getattr__(self, name: str):
        return getattr(self._batch, name)

    def validate_crc(self) -> bool:
        return self._batch.validate_crc()

    def __iter__(self) -> Iterator:
        batch, raw = self._batch, self._raw
        codec = batch.compression_type
        if codec:
            name = CODECS.get(codec, f"codec {codec}")
            try:
                body = decompress(codec, raw[RECORDS_OFFSET:], self._limit, room=RECORDS_OFFSET)
            except TooLarge:
                message = (f"a {name} record batch of {len(raw)} bytes (offsets {batch.base_offset}.."
                           f"{batch.next_offset - 1}) decompresses to more than {self._limit} bytes "
                           "(MAX_BATCH_BYTES); it was not decompressed. The value is the raw record batch.")
                yield from self._placeholders(batch.base_offset, "oversized", message)
                return
            except Exception as exc:
                message = (f"a {name} record batch (offsets {batch.base_offset}..{batch.next_offset - 1}) "
                           f"cannot be decompressed: {exc!r}. The value is the raw record batch.")
                yield from self._placeholders(batch.base_offset, "unreadable_record", message)
                return
            raw = _uncompressed(raw, body)
            batch = DefaultRecordBatch(raw)
        last = batch.base_offset - 1
        try:
            for record in batch:
                last = record.offset
                yield record
            return
        except Exception as exc:
            log.warning("aiokafka could not read a record after offset %d (%r); reading the rest of the batch "
                        "with the tolerant parser", last, exc)
        try:
            for record in _tolerant_records(raw):
                if record.offset > last:
                    last = record.offset
                    yield record
        except Exception as exc:
            message = (f"record at offset {last + 1} (batch {batch.base_offset}..{batch.next_offset - 1}) is not "
                       f"a valid Kafka record: {exc!r}. The value is the raw record batch.")
            yield from self._placeholders(last + 1, "unreadable_record", message)

    def _placeholders(self, first: int, reason: str, message: str) -> Iterator[Placeholder]:
        batch = self._batch
        header = [(Unreadable(reason, first, batch.next_offset - 1), message.encode())]
        yield Placeholder(first, batch.max_timestamp, batch.timestamp_type, bytes(self._raw), header)
        for offset in range(first + 1, batch.next_offset):
            yield Placeholder(offset, batch.max_timestamp, batch.timestamp_type, b"", header)


class Placeholder:
    """Stands for a record that could not be read: its offset and the batch's raw bytes."""

    __slots__ = ("offset", "timestamp", "timestamp_type", "key", "value", "headers")
    checksum = None

    def __init__(self, offset: int, timestamp: int, timestamp_type: int, value: bytes, headers: list) -> None:
        self.offset, self.timestamp, self.timestamp_type = offset, timestamp, timestamp_type
        self.key, self.value, self.headers = None, value, headers


class Record(Placeholder):
    """A record read by the tolerant parser."""

    __slots__ = ()

    def __init__(self, offset: int, timestamp: int, timestamp_type: int, key, value, headers: list) -> None:
        self.offset, self.timestamp, self.timestamp_type = offset, timestamp, timestamp_type
        self.key, self.value, self.headers = key, value, headers


# -- decompression, bounded ------------------------------------------------------

def decompress(codec: int, data: memoryview, limit: int, *, room: int = 0) -> memoryview:
    """The decompressed ``data``, after ``room`` free bytes at the start of the one buffer it is
    decompressed into (the batch's header goes there: no second copy of the records); or
    :class:`TooLarge`, without ever holding more than ``limit`` bytes.

    cramjam says a buffer was too small with a ``DecompressionError`` whose message says so
    ("failed to write whole buffer"); ``tests/unit/test_kafka_records.py`` checks, for every
    codec, that a bomb is told from corrupt data this way."""
    if codec == 2:
        return _snappy(bytes(data), limit, room)
    module = {1: cramjam.gzip, 3: cramjam.lz4, 4: cramjam.zstd}.get(codec)
    if module is None:
        raise ValueError(f"unknown compression codec {codec}")
    # A buffer sized for ordinary compression ratios first, then the bound (plus one
    # byte: a buffer filled to the brim says nothing about what comes after).
    for size in sorted({min(limit + 1, max(64 * 1024, 8 * len(data))), limit + 1}):
        out = None                                # the smaller try is freed before the larger one is made
        out = bytearray(room + size)
        try:
            written = module.decompress_into(data, memoryview(out)[room:])
        except cramjam.DecompressionError as exc:
            if OVERFLOW not in str(exc):
                raise
            continue
        if written < size:
            del out[room + written:]              # in place
            return memoryview(out)
    raise TooLarge()


OVERFLOW = "whole buffer"


def _snappy(data: bytes, limit: int, room: int) -> memoryview:
    """Snappy as Kafka writes it: xerial-framed raw blocks (Java), or one raw block."""
    if data[:8] != _XERIAL:
        blocks = [data]
    else:
        blocks, pos = [], 16
        while pos < len(data):
            (size,) = struct.unpack_from(">i", data, pos)
            if size <= 0 or pos + 4 + size > len(data):
                raise ValueError(f"a snappy block of {size} bytes at {pos} does not fit the {len(data)} of its batch")
            blocks.append(data[pos + 4:pos + 4 + size])
            pos += 4 + size
    # Every raw block starts with its uncompressed length: the bound is checked before inflating.
    sizes = [cramjam.snappy.decompress_raw_len(block) for block in blocks]
    if sum(sizes) > limit:
        raise TooLarge()
    out = bytearray(room + sum(sizes))
    view, at = memoryview(out), room
    for block, size in zip(blocks, sizes):
        at += cramjam.snappy.decompress_raw_into(block, view[at:at + size])
    del view
    del out[at:]
    return memoryview(out)


def _uncompressed(raw: memoryview, buffer: memoryview) -> memoryview:
    """The batch rebuilt with its records uncompressed, in ``buffer``, whose first bytes were left
    free for the header (its CRC, already checked, no longer matches)."""
    buffer[:RECORDS_OFFSET] = raw[:RECORDS_OFFSET]
    struct.pack_into(">i", buffer, 8, len(buffer) - LOG_OVERHEAD)
    (attributes,) = struct.unpack_from(">h", buffer, ATTRIBUTES_OFFSET)
    struct.pack_into(">h", buffer, ATTRIBUTES_OFFSET, attributes & ~CODEC_MASK)
    return buffer


# -- the tolerant parser -----------------------------------------------------------

def _tolerant_records(raw: memoryview) -> Iterator[Record]:
    """Records of an uncompressed v2 batch; header keys that are not UTF-8 kept with surrogateescape."""
    buf = bytes(raw)
    base_offset, = struct.unpack_from(">q", buf, 0)
    attributes, = struct.unpack_from(">h", buf, ATTRIBUTES_OFFSET)
    first_ts, max_ts = struct.unpack_from(">qq", buf, 27)
    count, = struct.unpack_from(">i", buf, 57)
    ts_type = 1 if attributes & LOG_APPEND_TIME else 0
    pos = RECORDS_OFFSET
    for _ in range(count):
        length, pos = decode_varint(buf, pos)
        end = pos + length
        if length < 0 or end > len(buf):
            raise ValueError(f"record length {length} runs past the batch")
        pos += 1                                              # attributes (unused)
        ts_delta, pos = decode_varint(buf, pos)
        offset_delta, pos = decode_varint(buf, pos)
        key, pos = _bytes(buf, pos, end)
        value, pos = _bytes(buf, pos, end)
        header_count, pos = decode_varint(buf, pos)
        if header_count < 0:
            raise ValueError(f"negative header count {header_count}")
        headers = []
        for _ in range(header_count):
            name, pos = _bytes(buf, pos, end)
            if name is None:
                raise ValueError("a header key is null")
            data, pos = _bytes(buf, pos, end)
            headers.append((name.decode("utf-8", "surrogateescape"), data))
        if pos != end:
            raise ValueError(f"record of {length} bytes has {end - pos} bytes left over")
        yield Record(base_offset + offset_delta, max_ts if ts_type else first_ts + ts_delta, ts_type, key, value,
                     headers)


def _bytes(buf: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    size, pos = decode_varint(buf, pos)
    if size < 0:
        return None, pos
    if pos + size > end:
        raise ValueError(f"a field of {size} bytes runs past its record")
    return buf[pos:pos + size], pos + size
