"""Records written by Kafka's own Java client (``harness/java/RawProducer.java``).

aiokafka refuses to write some records that are legal on the wire (neither key nor
value) and cannot size a compressed record the way the Java client does; the worker
must survive whatever any client can write, so the tests write those with Java.
The jars are the broker's (``make services`` fetched them).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from harness.services import ROOT

SOURCE = Path(__file__).with_name("java") / "RawProducer.java"


def kafka_libs() -> Path:
    version = os.environ.get("KAFKA_VERSION", "4.4.0")
    libs = ROOT / ".cache" / "kafka" / version / "libs"
    if not (libs / f"kafka-clients-{version}.jar").exists():
        raise AssertionError(f"no kafka-clients jar in {libs}: run `make services` first")
    return libs


def utf8(text: str) -> dict:
    return {"utf8": text}


def raw(data: bytes) -> dict:
    return {"hex": data.hex()}


def zeros(count: int) -> dict:
    return {"zeros": count}


def java_produce(bootstrap: str, topic: str, records: list[dict], *, compression: str = "none",
                 transactional_id: str | None = None, config: dict[str, str] | None = None,
                 timeout: float = 180.0) -> list[tuple[int, int]]:
    """Produce ``records`` to the brokers at ``bootstrap`` (host:port,...) (see RawProducer.java for their form); return (partition, offset) of each
    record (``{"txn": ...}`` lines, with a ``transactional_id``, are transaction steps, not records).
    ``config``: more producer settings (``{"batch.size": "104857600", "linger.ms": "2000"}``)."""
    lines = "".join(json.dumps(record) + "\n" for record in records)
    args = [bootstrap, topic, compression]
    if transactional_id or config:
        args.append(transactional_id or "-")
    if config:
        args.append(";".join(f"{name}={value}" for name, value in config.items()))
    done = subprocess.run(["java", "-cp", f"{kafka_libs()}/*", str(SOURCE), *args], input=lines,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"RawProducer failed ({done.returncode}):\n{done.stderr[-3000:]}")
    placed = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(placed) == sum(1 for record in records if "txn" not in record), done.stdout[-2000:]
    return [(p["partition"], p["offset"]) for p in placed]
