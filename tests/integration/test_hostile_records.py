"""Records other clients write that once crash-looped the worker,
written here by those clients: Kafka's own Java producer and librdkafka's kcat.

Each test puts good events before and after the hostile record on one partition and
checks the invariant that matters: the worker stays up, the hostile record is on the
dead-letter topic once with its reason and a ledger row, the good events are done and
the group's offset reaches the end of the partition."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import resource
import shutil
import subprocess

import pytest

from app.pipeline.events import decode
from app.pipeline.plan import step_keys
from harness.events import event, order_no, record
from harness.java import java_produce, raw, utf8, zeros
from harness.services import caught_up, consume_all, produce, wait_for

ENV = {"BATCH_WITHIN_SECONDS": "0.5", "RETRY_BACKOFF_MS": "50,100,150"}


def headers(rec) -> dict[str, str]:
    return {k: v.decode(errors="replace") for k, v in rec.headers or () if k.startswith("dlq.")}


def vm_hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM"))
    return int(line.split()[1]) / 1024


class Run:
    """Good events around hostile records on one partition, and one worker over them."""

    def __init__(self, settings, topics, spawn_worker, scratch_db, prefix: str) -> None:
        self.settings, self.db = settings, scratch_db
        self.pair = topics(partitions=1)
        self.spawn = spawn_worker
        self.good = [event(order_no(prefix=prefix), "ORDER_CREATED") for _ in range(6)]
        asyncio.run(produce(settings, self.pair.events, [record(d) for d in self.good[:3]]))

    def finish(self, **env) -> None:
        asyncio.run(produce(self.settings, self.pair.events, [record(d) for d in self.good[3:]]))
        self.worker = self.spawn(self.pair, **ENV, **env)
        wait_for(lambda: caught_up(self.settings, self.pair.events, self.pair.group, 1), timeout=120,
                 what="the partition committed to its end", workers=[self.worker])
        keys = [step_keys(decode(*record(d), max_bytes=1 << 20))[0] for d in self.good]
        marks = ", ".join(["%s"] * len(keys))
        assert self.db.scalar(f"SELECT COUNT(*) FROM t_idem WHERE status = 2 AND biz_key IN ({marks})", *keys) == 6

    def letters(self, expect: int) -> list:
        found = asyncio.run(consume_all(self.settings, self.pair.dlq, expect=expect, timeout=30))
        assert len(found) == expect, [headers(r) for r in found]
        return found

    def ledger(self) -> list[dict]:
        return self.db.query("SELECT src_offset, reason, truncated FROM t_compensation WHERE src_topic = %s "
                             "ORDER BY src_offset", self.pair.events)


def test_a_record_with_neither_key_nor_value_is_dead_lettered_with_a_placeholder(settings, topics, spawn_worker,
                                                                                    scratch_db):
    run = Run(settings, topics, spawn_worker, scratch_db, "NULLNULL")
    [(_, offset)] = java_produce(settings.kafka.bootstrap, run.pair.events, [{"partition": 0, "key": None, "value": None,
                                                              "headers": [["trace", utf8("t-1")], ["n", None]]}])
    run.finish()
    [letter] = run.letters(1)
    h = headers(letter)
    assert (h["dlq.error.type"], h["dlq.placeholder"], h["dlq.original.offset"]) == ("empty_value", "value",
                                                                                     str(offset))
    assert (letter.key, letter.value) == (None, b"")
    assert [(k, v) for k, v in letter.headers if not k.startswith("dlq.")] == [("trace", b"t-1"), ("n", None)]
    assert run.ledger() == [{"src_offset": offset, "reason": "empty_value", "truncated": 0}]
    assert run.worker.alive


def test_a_gzip_record_of_10_mib_is_dead_lettered_truncated(settings, topics, spawn_worker, scratch_db):
    run = Run(settings, topics, spawn_worker, scratch_db, "GZ10M")
    key = b"ORD-20261129-GZ10M"
    [(_, offset)] = java_produce(settings.kafka.bootstrap, run.pair.events, [{"partition": 0, "key": raw(key),
                                                              "value": zeros(10 << 20)}], compression="gzip")
    run.finish(DLQ_TRUNCATE_BYTES="4096")
    [letter] = run.letters(1)
    h = headers(letter)
    assert (h["dlq.error.type"], h["dlq.truncated"], h["dlq.original.value.bytes"]) == ("oversized", "value",
                                                                                         str(10 << 20))
    assert h["dlq.original.value.sha256"] == hashlib.sha256(bytes(10 << 20)).hexdigest()
    assert (letter.key, letter.value) == (key, bytes(4096))
    assert run.ledger() == [{"src_offset": offset, "reason": "oversized", "truncated": 1}]


def test_a_decompression_bomb_is_never_inflated(settings, topics, spawn_worker, scratch_db):
    """1 GiB of zeros, gzipped by the Java client to about 1 MiB: the broker takes it (its
    limit counts compressed bytes); the worker must neither die nor hold a gigabyte."""
    run = Run(settings, topics, spawn_worker, scratch_db, "BOMB")
    [(_, offset)] = java_produce(settings.kafka.bootstrap, run.pair.events, [{"partition": 0, "key": utf8("ORD-20261129-BOMB"),
                                                              "value": zeros(1 << 30)}], compression="gzip")
    run.finish(MAX_BATCH_BYTES=str(32 << 20))
    [letter] = run.letters(1)
    h = headers(letter)
    assert h["dlq.error.type"] == "oversized" and "decompresses to more than 33554432 bytes" in h["dlq.error.message"]
    assert h["dlq.truncated"] == "value" and int(h["dlq.original.value.bytes"]) < 2 << 20   # the raw batch
    assert run.ledger() == [{"src_offset": offset, "reason": "oversized", "truncated": 1}]
    peak = vm_hwm_mb(run.worker.proc.pid)
    assert peak < 400, f"the worker's peak RSS was {peak:.0f} MB"


@pytest.mark.parametrize("codec", ["snappy", "lz4", "zstd"])
def test_records_in_every_codec_the_java_client_writes_are_read(settings, topics, spawn_worker, scratch_db, codec):
    run = Run(settings, topics, spawn_worker, scratch_db, f"CODEC{codec.upper()}")
    docs = [event(order_no(prefix="CODEC"), "ORDER_CREATED") for _ in range(3)]
    java_produce(settings.kafka.bootstrap, run.pair.events, [{"partition": 0, "key": raw(k), "value": raw(v)}
                                             for k, v in map(record, docs)], compression=codec)
    run.finish()
    keys = [step_keys(decode(*record(d), max_bytes=1 << 20))[0] for d in docs]
    assert scratch_db.scalar("SELECT COUNT(*) FROM t_idem WHERE status = 2 AND biz_key IN (%s, %s, %s)", *keys) == 3
    assert run.letters(0) == []


def test_a_header_key_that_is_not_utf8_is_dead_lettered_with_its_raw_headers(settings, topics, spawn_worker,
                                                                               scratch_db):
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    assert kcat, "kcat is needed (make test-tools installs Debian's kcat)"
    run = Run(settings, topics, spawn_worker, scratch_db, "RAWHDR")
    doc = event(order_no(prefix="RAWHDR"), "ORDER_CREATED")
    key, value = record(doc)
    subprocess.run([kcat, "-P", "-b", settings.kafka.bootstrap, "-t", run.pair.events, "-p", "0", "-k", key,
                    b"-H", b"\xff\xfebad=1", b"-H", b"trace=t-9"], input=value, check=True, timeout=60)
    run.finish()
    [letter] = run.letters(1)
    h = headers(letter)
    assert h["dlq.error.type"] == "header_not_utf8" and (letter.key, letter.value) == (key, value)
    original = [[base64.b64decode(k), base64.b64decode(v)] for k, v in json.loads(h["dlq.original.headers"])]
    assert original == [[b"\xff\xfebad", b"1"], [b"trace", b"t-9"]]
    assert [(k, v) for k, v in letter.headers if not k.startswith("dlq.")] == [("\\xff\\xfebad", b"1"),
                                                                              ("trace", b"t-9")]
    assert run.worker.alive


def test_a_key_of_megabytes_and_megabytes_of_values_fit_the_ledger(settings, topics, spawn_worker, scratch_db):
    """An 8 MiB key of zeros, gzipped by the Java client to a few KiB, and 17 values of 1 MiB that
    are not JSON: the ledger's one INSERT of them all was over MariaDB's 16 MiB max_allowed_packet
    (the worker exited 70 on every retry). The ledger keeps 64 KiB of a part it cannot run again,
    with its size and SHA-256, and writes a batch's letters in statements of about 1 MiB."""
    run = Run(settings, topics, spawn_worker, scratch_db, "BIGKEY")
    placed = java_produce(settings.kafka.bootstrap, run.pair.events,
                          [{"partition": 0, "key": zeros(8 << 20), "value": utf8("{}")}]
                          + [{"partition": 0, "key": utf8("k"), "value": zeros(1 << 20)} for _ in range(17)],
                          compression="gzip")
    run.finish()
    assert len(run.letters(18)) == 18
    rows = scratch_db.query("SELECT src_offset, reason, LENGTH(record_key) AS key_kept, record_key_bytes, "
                            "record_key_sha256, LENGTH(record_value) AS value_kept, record_value_bytes "
                            "FROM t_compensation WHERE src_topic = %s ORDER BY src_offset", run.pair.events)
    assert [r["src_offset"] for r in rows] == [offset for _, offset in placed]
    big_key = rows[0]
    assert (big_key["key_kept"], big_key["record_key_bytes"]) == (64 * 1024, 8 << 20)
    assert big_key["record_key_sha256"] == hashlib.sha256(bytes(8 << 20)).hexdigest()
    assert {(r["reason"], r["value_kept"], r["record_value_bytes"]) for r in rows[1:]} == {
        ("not_json", 64 * 1024, 1 << 20)}
    assert run.worker.alive


def test_megabytes_of_raw_header_keys_fit_the_dead_letter_topic(settings, topics, spawn_worker, scratch_db):
    """kcat writes 50 headers of 100 KB whose keys are not UTF-8: the dead letter's JSON copy of
    them took it to 12 MiB against the topic's 9 MiB, the send failed and the worker stopped on
    it again after every restart. The record is sized as it will be encoded; the copy goes."""
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    assert kcat, "kcat is needed (make test-tools installs Debian's kcat)"
    run = Run(settings, topics, spawn_worker, scratch_db, "HDR5M")
    doc = event(order_no(prefix="HDR5M"), "ORDER_CREATED")
    key, value = record(doc)
    args = [kcat, "-P", "-b", settings.kafka.bootstrap, "-t", run.pair.events, "-p", "0", "-k", key,
            "-X", "message.max.bytes=9000000"]
    for i in range(50):
        args += [b"-H", b"\xff\xfek%d=" % i + b"v" * 100_000]
    # 5 MB of arguments: more than the 2 MiB a default stack allows (a quarter of it)
    subprocess.run(args, input=value, check=True, timeout=60,
                   preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_STACK, (256 << 20, resource.RLIM_INFINITY)))
    run.finish()
    [letter] = run.letters(1)
    h = headers(letter)
    assert h["dlq.error.type"] == "header_not_utf8" and "dlq.original.headers" not in h
    assert h["dlq.original.headers.count"] == "50" and (letter.key, letter.value) == (key, value)
    assert len([k for k, _ in letter.headers if not k.startswith("dlq.")]) == 50
    assert run.worker.alive


def test_a_batch_of_thousands_of_unreadable_records_is_a_letter_per_batch(settings, topics, spawn_worker,
                                                                         scratch_db):
    """One gzip batch of 2,000 records of 40 KB of zeros (about 100 KB on the wire, 80 MB
    inflated, over MAX_BATCH_BYTES): a placeholder per offset, each carrying the raw batch,
    came to 2,000 letters in one INSERT (StoreFailure) and 128 MB of copies. Now the raw batch
    is kept once and one letter per batch stands for the rest."""
    run = Run(settings, topics, spawn_worker, scratch_db, "RUN2K")
    placed = java_produce(settings.kafka.bootstrap, run.pair.events,
                          [{"partition": 0, "key": utf8(f"k{i}"), "value": zeros(40_000)} for i in range(2000)],
                          compression="gzip", config={"batch.size": str(128 << 20), "buffer.memory": str(256 << 20),
                                                      "linger.ms": "5000"})
    first, last = placed[0][1], placed[-1][1]
    assert last - first == 1999
    run.finish()
    rows = scratch_db.query("SELECT src_offset, reason, message, LENGTH(record_value) AS kept FROM t_compensation "
                            "WHERE src_topic = %s ORDER BY src_offset", run.pair.events)
    assert 1 <= len(rows) <= 8 and rows[0]["src_offset"] == first                   # a letter per batch of 500
    assert {r["reason"] for r in rows} == {"oversized"} and rows[0]["kept"] == 64 * 1024
    covered = [tuple(map(int, re.search(r"stands for offsets (\d+)\.\.(\d+)", r["message"]).groups()))
               for r in rows]
    assert covered[0][0] == first and covered[-1][1] == last
    assert all(a[1] + 1 == b[0] for a, b in zip(covered, covered[1:])), covered     # every offset, once
    letters = run.letters(len(rows))
    h = [headers(letter) for letter in letters]
    assert sorted(int(x["dlq.original.offset"]) for x in h) == [r["src_offset"] for r in rows]
    raw = [letter for letter, x in zip(letters, h) if "dlq.raw.batch.offset" not in x]
    assert len(raw) == 1 and int(headers(raw[0])["dlq.original.value.bytes"]) < 1 << 20    # the raw batch, once
    assert sum(int(x["dlq.covers.count"]) for x in h) == 2000
    assert run.worker.alive
