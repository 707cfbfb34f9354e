"""What the numbers were measured on: CPUs, Python, package, Kafka and MariaDB versions."""

from __future__ import annotations

import glob
import os
import platform
import re
from importlib import metadata
from pathlib import Path

PACKAGES = ("faust-streaming", "aiokafka", "SQLAlchemy", "aiomysql", "PyMySQL", "aiohttp")


def describe(mariadb_version: str | None) -> dict:
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "kafka": kafka_version() or "unknown",
        "mariadb": mariadb_version or "unknown",
        "packages": {name: _version(name) for name in PACKAGES},
        # What else the machine was doing: the figures mean little without it.
        "loadavg": " / ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1 / 5 / 15 min)",
    }


def kafka_version() -> str | None:
    """The version of a local broker, read from the jars on its class path (``kafka.Kafka`` process)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kafka.Kafka" not in args or b"-cp" not in args:
            continue
        classpath = args[args.index(b"-cp") + 1].decode(errors="replace")
        for entry in classpath.split(":"):
            for jar in glob.glob(entry) if "*" in entry else [entry]:
                match = re.search(r"kafka_[\d.]+-(\d+\.\d+\.\d+)\.jar$", jar)
                if match:
                    return match.group(1)
    return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
